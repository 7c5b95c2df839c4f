"""Joining a Ray cluster through RAY_ADDRESS: an address where nothing answers is refused in seconds with one line
naming RAY_ADDRESS and what to do (exit 2), where ray.init would retry for many minutes."""

import os
import subprocess
import sys
import time

import pytest

from mindspeed_rl.trainer.runtime import ray_run
from mindspeed_rl.utils.cli import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def not_joined(monkeypatch):
    """init_ray as in a fresh driver, whatever this test process did with Ray before."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv(ray_run.JOIN_TIMEOUT_ENV, raising=False)


def test_an_address_where_nothing_listens_is_refused_in_seconds_naming_ray_address(not_joined, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    start = time.perf_counter()
    with pytest.raises(UserError) as caught:
        ray_run.init_ray({})  # ray.init waited there past 300 s
    assert time.perf_counter() - start < 5
    message = str(caught.value)
    assert message.startswith("RAY_ADDRESS=127.0.0.1:9: no Ray cluster answers there (connection refused)")
    assert "ray start --head" in message and "unset RAY_ADDRESS" in message and "\n" not in message


def test_an_address_that_accepts_but_never_answers_is_refused_at_the_join_timeout(not_joined, monkeypatch):
    """A listener on loopback whose backlog takes the connection and that never speaks (as a host behind a
    proxy that accepts every connection, or a hung GCS)."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", address)
        monkeypatch.setenv(ray_run.JOIN_TIMEOUT_ENV, "1")
        start = time.perf_counter()
        with pytest.raises(
            UserError, match=rf"^RAY_ADDRESS={address}: no Ray cluster answers there \(no answer within 1 s"
        ):
            ray_run.init_ray({})
        assert time.perf_counter() - start < 3


def test_a_grpc_server_that_is_not_a_gcs_is_refused():
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(UserError, match="something answers, but not as a Ray GCS: UNIMPLEMENTED"):
            ray_run.check_ray_address(f"127.0.0.1:{port}", 5.0)
    finally:
        server.stop(None)


@pytest.mark.parametrize(
    "address, timeout, words",
    [
        ("head-node", None, "RAY_ADDRESS='head-node' is not host:port"),
        ("127.0.0.1:9", "soon", "MINDSPEED_RL_RAY_JOIN_TIMEOUT='soon': not a positive number of seconds"),
        ("127.0.0.1:9", "0", "MINDSPEED_RL_RAY_JOIN_TIMEOUT='0': not a positive number of seconds"),
    ],
)
def test_a_malformed_address_or_join_timeout_is_named(not_joined, monkeypatch, address, timeout, words):
    monkeypatch.setenv("RAY_ADDRESS", address)
    if timeout is not None:
        monkeypatch.setenv(ray_run.JOIN_TIMEOUT_ENV, timeout)
    with pytest.raises(UserError, match=f"^{words}"):
        ray_run.init_ray({})


def test_rays_own_connection_error_is_one_line_naming_ray_address(not_joined, monkeypatch):
    """RAY_ADDRESS=auto with no cluster on the machine: ray.init raises ConnectionError at once (1.5 s here; not
    run for real: a cluster another test started on this machine would be joined)."""
    import ray

    def no_cluster(**kwargs):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "init", no_cluster)
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(UserError, match=r"^RAY_ADDRESS=auto: Could not find any running Ray instance; start the"):
        ray_run.init_ray({})


@pytest.mark.slow
def test_a_running_cluster_passes_the_check():
    code = (
        "import ray\n"
        "ray.init(num_cpus=1, include_dashboard=False, logging_level='ERROR')\n"
        "print(ray.get_runtime_context().gcs_address, flush=True)\n"
        "input()\n"
    )
    head = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = head.stdout.readline().strip()
        start = time.perf_counter()
        ray_run.check_ray_address(address, 10.0)
        assert time.perf_counter() - start < 2
        ray_run.check_ray_address("auto", 1.0)  # Ray's to find (or refuse: a ConnectionError, in one line too)
    finally:
        head.communicate("\n", timeout=60)


def test_the_training_cli_exits_2_with_one_line_before_ray_starts(demo_assets, tmp_path):
    paths = demo_assets
    env = dict(os.environ, PYTHONWARNINGS="ignore", RAY_ADDRESS="127.0.0.1:9")
    env.pop(ray_run.JOIN_TIMEOUT_ENV, None)
    args = [
        "--config-name",
        "ppo_tiny_cpu",
        f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
        f"megatron_training.data_path={paths['data_prefix']}",
        f"megatron_training.test_data_path={paths['test_prefix']}",
        f"rl_config.log_dir={tmp_path}/logs",
        f"actor_config.save={tmp_path}/ckpt/actor",
        f"critic_config.save={tmp_path}/ckpt/critic",
    ]
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "cli", "train_ppo.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: RAY_ADDRESS=127.0.0.1:9: no Ray cluster"), done.stderr
    assert "placement group:" not in done.stdout  # Ray was never started
