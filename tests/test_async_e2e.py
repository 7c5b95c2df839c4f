"""Asynchronous GRPO on the disaggregated layout stopped by SIGTERM: the actor on one CPU slot, a rollout worker
on another producing the next batch while the actor trains (max_head_offpolicyness 1). Exact resume of
asynchronous rollout, with partial rollout, dynamic sampling and the tool agent, is tests/test_tools_e2e.py.
The weights reach the rollout worker through vLLM's weight-transfer API here (``weight_transfer:
vllm_native``, our gloo engine on CPU); the other disaggregated runs use our channel."""

import pytest

from mindspeed_rl.checkpoint import megatron_layout as ml


@pytest.mark.slow
@pytest.mark.usefixtures("without_shared_ray")  # its runs start Ray clusters of their own
def test_sigterm_during_async_training_leaves_a_checkpoint_the_hint_resumes(tmp_path, demo_assets):
    """SIGTERM while the rollout worker generates the next batch: exit 143, the last checkpoint whole (with
    its batch in flight), and the printed resume overrides continue the run to its end."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT, wait_for

    paths = demo_assets
    root = tmp_path / "run"
    args = [
        sys.executable,
        os.path.join(ROOT, "cli", "train_ppo.py"),
        "--config-name",
        "grpo_tiny_cpu_async",
        f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
        f"megatron_training.data_path={paths['data_prefix']}",
        "megatron_training.test_data_path=null",
        "rl_config.test_freq=0",
        "rl_config.val_before_train=false",
        "megatron_training.global_batch_size=8",
        "rl_config.mini_batch_size=32",
        "megatron_training.save_interval=1",
        f"rl_config.log_dir={root}/logs",
        f"actor_config.save={root}/ckpt/actor",
        "generate_config.weight_transfer=vllm_native",
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(
        args + ["megatron_training.train_iters=6"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    head = "".join(wait_for(proc, "saved iteration 2"))
    proc.send_signal(signal.SIGTERM)
    try:
        out = proc.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:  # say where the shutdown hung: the driver's threads' stacks (SIGUSR1)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(5)
        proc.kill()
        pytest.fail("no exit within 120 s of SIGTERM; its output and stacks:\n" + proc.communicate()[0][-8000:])
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM" in out and "Traceback (most recent" not in out
    assert "weights over vllm_native" in head, head[-3000:]
    assert "\x1b[" not in head + out  # no ANSI colour in Ray's worker-log prefix when the console is a pipe
    saved = ml.read_tracker(str(root / "ckpt" / "actor"))
    assert isinstance(saved, int) and saved >= 2
    assert not [d for d in os.listdir(root / "ckpt" / "actor") if d.endswith((".tmp", ".part"))]
    inflight = ml.load_rank(str(root / "ckpt" / "actor"), 0, 0)["trainer_state"]["rollout_source"]["ahead"]
    assert [b["iteration"] for b in inflight] == [saved]  # the batch for the next iteration (0-based index)

    hint = out.split("Resume by adding: ")[1].split()
    assert hint == [
        "actor_config.finetune=false",
        f"actor_config.load={root}/ckpt/actor",
        "actor_config.no_load_optim=false",
        "actor_config.no_load_rng=false",
    ], out[-2000:]
    resumed = subprocess.run(
        args + [f"megatron_training.train_iters={saved + 1}"] + hint,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"iter {saved + 1}/{saved + 1}" in resumed.stdout and "iter 1/" not in resumed.stdout
    assert ml.read_tracker(str(root / "ckpt" / "actor")) == saved + 1
