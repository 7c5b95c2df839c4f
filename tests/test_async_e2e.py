"""Asynchronous GRPO on the disaggregated layout end to end: the actor on one CPU slot, a rollout worker on
another generating the next batch while the actor trains (max_head_offpolicyness 1), weights pushed over the
weight channel after every update; a checkpoint holds the batch in flight, and 2 + resume + 1 == 3 straight."""

import pytest

from mindspeed_rl.checkpoint import megatron_layout as ml

COMPARED = (
    "critic/score/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "grad_norm",
    "response_length/mean",
    "rollout/staleness_mean",
    "rollout_correction/is_weight_mean",
)


@pytest.mark.slow
def test_async_grpo_on_a_rollout_worker_resumes_exactly(tmp_path):
    import ray

    from mindspeed_rl.trainer.launch import train
    from mindspeed_rl.utils.demo_assets import prepare
    from tests.helpers import demo_config

    paths = prepare(str(tmp_path / "assets"), 256)
    keys = {
        "rl_config.rollout_resource.num_npus": 1,
        "rl_config.max_head_offpolicyness": 1,
        "megatron_training.global_batch_size": 8,
        "rl_config.mini_batch_size": 32,
        "megatron_training.test_data_path": "null",
        "rl_config.test_freq": 0,
        "rl_config.val_before_train": "false",
        "actor_config.no_load_optim": "false",
        "actor_config.no_load_rng": "false",
    }
    straight_root, split_root = str(tmp_path / "straight"), str(tmp_path / "split")
    try:
        straight = train(demo_config("grpo_tiny_cpu", straight_root, paths, 3, **keys))
        first = train(demo_config("grpo_tiny_cpu", split_root, paths, 2, **keys))
        state = ml.load_rank(f"{split_root}/ckpt/actor", 0, 0)["trainer_state"]
        second = train(
            demo_config(
                "grpo_tiny_cpu",
                split_root,
                paths,
                3,
                **keys,
                **{"actor_config.finetune": "false", "actor_config.load": f"{split_root}/ckpt/actor"},
            )
        )
    finally:
        ray.shutdown()
    assert [m["iteration"] for m in straight] == [1, 2, 3] and [m["iteration"] for m in second] == [3]
    # iteration 1 trains on samples of its own weights, pushed exactly to the rollout worker (fp32 both sides);
    # later ones on the batch generated while the previous iteration trained: one version old
    assert straight[0]["rollout/staleness_max"] == 0 and straight[0]["rollout/logprob_diff_max"] < 1e-3
    assert all(m["rollout/staleness_max"] == 1 and m["rollout/staleness_mean"] == 1 for m in straight[1:])
    assert all(m["timing/weight_sync"] > 0 and 0 <= m["async/overlap_share"] <= 1 for m in straight)
    inflight = state["async_rollout"]
    assert [b["iteration"] for b in inflight] == [2] and inflight[0]["version"] == 1
    assert len(inflight[0]["outputs"]) == 8 * 8
    for a, b in zip(straight, first + second):
        for key in COMPARED:
            if key in a or key in b:
                assert a[key] == pytest.approx(b[key], abs=1e-6), (a["iteration"], key)


@pytest.mark.slow
def test_sigterm_during_async_training_leaves_a_checkpoint_the_hint_resumes(tmp_path):
    """SIGTERM while the rollout worker generates the next batch: exit 143, the last checkpoint whole (with
    its batch in flight), and the printed resume overrides continue the run to its end."""
    import os
    import signal
    import subprocess
    import sys

    from mindspeed_rl.utils.demo_assets import prepare
    from tests.helpers import ROOT, wait_for

    paths = prepare(str(tmp_path / "assets"), 256)
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
    wait_for(proc, "saved iteration 2")
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM" in out and "Traceback (most recent" not in out
    saved = ml.read_tracker(str(root / "ckpt" / "actor"))
    assert isinstance(saved, int) and saved >= 2
    assert not [d for d in os.listdir(root / "ckpt" / "actor") if d.endswith((".tmp", ".part"))]
    inflight = ml.load_rank(str(root / "ckpt" / "actor"), 0, 0)["trainer_state"]["async_rollout"]
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
