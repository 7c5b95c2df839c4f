"""examples/ppo/ppo_trainer_qwen25_32b.sh on one machine as two Ray nodes (two raylets): the placement
group spans both nodes, a short PPO run completes, and an unrelated Ray cluster is left alone."""

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

SCRIPT = os.path.join(ROOT, "examples", "ppo", "ppo_trainer_qwen25_32b.sh")


def ray_bin():
    return os.path.join(os.path.dirname(sys.executable), "ray")


@pytest.mark.slow
@pytest.mark.usefixtures("without_shared_ray")  # its clusters alone on the machine, as on a user's
def test_two_node_launch_spans_nodes_and_leaves_other_ray_alone(tmp_path, demo_assets):
    import tempfile

    short = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    paths = demo_assets
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "RAY_AUTH_MODE": "disabled",
        "NNODES": "2",
        "NPUS_PER_NODE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "CURRENT_IP": "127.0.0.1",
        "RAY_PORT": "6371",
        "RAY_TMP": os.path.join(short, "a"),
        "LOG_DIR": str(tmp_path / "logs"),
        "WAIT_SECONDS": "180",
        "PYTHONWARNINGS": "ignore",
    }
    other_tmp = os.path.join(short, "b")
    # in a session of its own: its agents outlive a SIGKILL of its raylet, and only the session finds them all
    other = subprocess.Popen(
        [
            ray_bin(),
            "start",
            "--head",
            "--port",
            "6372",
            "--num-cpus",
            "0",
            "--temp-dir",
            other_tmp,
            "--include-dashboard",
            "false",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _, err = other.communicate(timeout=180)
    assert other.returncode == 0, err
    other_sid = other.pid  # the session's id: its leader's pid
    overrides = [
        f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
        f"megatron_training.data_path={paths['data_prefix']}",
        f"rl_config.log_dir={tmp_path}/logs",
        "megatron_training.test_data_path=null",  # no validation: the run only has to span the nodes
        "rl_config.test_freq=0",
        "rl_config.val_before_train=false",
        "megatron_training.train_iters=1",
        "megatron_training.global_batch_size=8",
        "rl_config.actor_resource.num_npus=2",
        "rl_config.critic_resource.num_npus=2",
        f"actor_config.save={tmp_path}/ckpt/actor",
        f"critic_config.save={tmp_path}/ckpt/critic",
    ]
    # a process whose command line holds RAY_TMP as the prefix of another path: not the launcher's to stop
    decoy = subprocess.Popen(["bash", "-c", "sleep 600", env["RAY_TMP"] + "_decoy/x"])
    try:
        worker = subprocess.Popen(
            ["bash", SCRIPT, "ppo_tiny_cpu"],
            env={**env, "NODE_RANK": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=str(tmp_path),
        )
        time.sleep(1)
        head = subprocess.run(
            ["bash", SCRIPT, "ppo_tiny_cpu", *overrides],
            env={**env, "NODE_RANK": "0"},
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            timeout=600,
        )
        out = head.stdout + head.stderr
        assert head.returncode == 0, out[-4000:]
        assert "2 / 2 CPU in the cluster" in out
        assert "placement group: 2 bundle(s) on 2 node(s)" in out
        assert "iter 1/1" in out
        assert "iter 1/1" in open(tmp_path / "logs" / "training.log").read()
        worker.wait(timeout=120)
        assert "the head's cluster is gone" in worker.stdout.read()
        assert decoy.poll() is None  # still running: stopping is by session, never by name
        decoy.kill()
        decoy.wait()
        assert subprocess.run(["pgrep", "-f", env["RAY_TMP"]], capture_output=True).returncode == 1
        # the unrelated cluster still runs
        assert subprocess.run(["pgrep", "-f", other_tmp], capture_output=True).returncode == 0
    finally:
        decoy.kill()
        subprocess.run(["pkill", "-9", "-s", str(other_sid)])
        subprocess.run(["pkill", "-9", "-f", env["RAY_TMP"]])


def test_a_node_waits_for_the_heads_port_before_ray_start_and_gives_up_after_wait_seconds(tmp_path):
    """A node started before its head does not begin `ray start --address` (which would give up after a minute
    even once the head came up): it waits for the head's GCS port, and after WAIT_SECONDS stops with exit 2."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "NNODES": "2",
        "NODE_RANK": "1",
        "LOG_DIR": str(tmp_path / "logs"),
        "MASTER_ADDR": "127.0.0.1",
        "CURRENT_IP": "127.0.0.1",
        "RAY_PORT": "1",  # nothing listens there
        "WAIT_SECONDS": "3",
        "RAY": "/bin/false",  # a `ray start` would fail loudly: it must not be reached
    }
    proc = subprocess.run(["bash", SCRIPT], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "[launcher] error: the head 127.0.0.1:1 did not answer within 3s" in proc.stderr
    assert "ray start failed" not in proc.stderr and not os.path.exists(tmp_path / "logs" / "ray_node.log")


def test_a_config_typo_through_the_launcher_is_refused_before_ray_starts(tmp_path, demo_assets):
    """The head validates the config (cli/train_ppo.py --check) before `ray start`: a typo costs seconds,
    and a run from another folder is told where relative paths are read from."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "NNODES": "1",
        "LOG_DIR": str(tmp_path / "logs"),
        "MASTER_ADDR": "127.0.0.1",
        "CURRENT_IP": "127.0.0.1",
        "WAIT_SECONDS": "5",  # the head, whatever the
        "RAY": "/bin/false",
    }  # suite left in os.environ; a Ray start would fail loudly: it must not be reached
    start = time.perf_counter()
    proc = subprocess.run(
        ["bash", SCRIPT, "ppo_tiny_cpu", "rl_config.n_samples_per_prompt=abc"],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "config error: rl_config.n_samples_per_prompt: got 'abc', expected an integer" in proc.stderr
    assert "ray start" not in proc.stdout + proc.stderr and time.perf_counter() - start < 60
    assert (
        f"[launcher] running in {ROOT}: relative paths in the config and the overrides are read from there"
        in proc.stdout
    )
    # a valid config passes the check and goes on to `ray start`, whose failure is one line with its reason
    paths = demo_assets
    overrides = [
        f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
        f"megatron_training.data_path={paths['data_prefix']}",
        f"megatron_training.test_data_path={paths['test_prefix']}",
    ]
    proc = subprocess.run(
        ["bash", SCRIPT, "ppo_tiny_cpu", *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "[launcher] error: ray start failed (" in proc.stderr, proc.stderr
    assert "check: the config and its paths are valid" in open(tmp_path / "logs" / "plan.txt").read()


FAKE_RAY = """#!/bin/bash
# the first start: its raylet dies starting (a metrics agent too slow to start, seen in the suite)
if [ "$1" = start ] && [ ! -e "$0.started" ]; then
  touch "$0.started"
  echo "Exception: The current node timed out during startup. (simulated: the raylet died)"
  exit 1
fi
exec "{python}" - "$@" <<'PY'
import sys, time, types

import ray._private.node as node
import ray._private.services as services


def never(*args, **kwargs):  # the raylet runs, but `ray start` never sees it registered
    raise RuntimeError("GCS cannot find the node (simulated)")


clock = iter(range(0, 10**6, 31))  # Ray's fixed 30 s wait passes at once
node.time = types.SimpleNamespace(**{{k: getattr(time, k) for k in dir(time) if not k.startswith("_")}})
node.time.monotonic = lambda: next(clock)
services.get_node = never
from ray.scripts.scripts import main

sys.argv = ["ray"] + sys.argv[1:]
main()
PY
"""


@pytest.mark.usefixtures("without_shared_ray")
def test_a_head_whose_raylet_registers_after_rays_wait_is_taken(tmp_path):
    """`ray start` gives a raylet a fixed 30 s to register with its GCS; on a loaded host both may still be starting
    (seen in the suite), or the raylet may have died starting. The head waits for its devices in the cluster while its
    raylet runs, and starts again where it died, instead of failing the launch."""
    import tempfile

    fake = tmp_path / "ray"
    fake.write_text(FAKE_RAY.format(python=sys.executable))
    fake.chmod(0o755)
    entry = tmp_path / "entry.py"
    entry.write_text("import sys\nprint('entry ran', sys.argv[1:])\n")
    short = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "RAY": str(fake),
        "ENTRY": str(entry),
        "RAY_AUTH_MODE": "disabled",
        "NNODES": "1",
        "NPUS_PER_NODE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "CURRENT_IP": "127.0.0.1",
        "RAY_PORT": "6373",
        "RAY_TMP": os.path.join(short, "a"),
        "LOG_DIR": str(tmp_path / "logs"),
    }
    try:
        proc = subprocess.run(
            ["bash", SCRIPT, "ppo_tiny_cpu"], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=180
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert "did not register within Ray's 30 s; waiting 60 s more" in out and "1 / 1 CPU in the cluster" in out
        assert out.count("starting the head again") == 1, out[-3000:]  # the first start's raylet died
        assert "entry ran ['--config-name', 'ppo_tiny_cpu']" in out
    finally:
        subprocess.run(["pkill", "-9", "-f", env["RAY_TMP"]])
