"""Asynchronous GRPO on the disaggregated layout end to end: the actor on one CPU slot, a rollout worker on
another generating the next batch while the actor trains (max_head_offpolicyness 1), weights pushed over the
weight channel after every update; a checkpoint holds the batch in flight, and 2 + resume + 1 == 3 straight."""
import pytest

from mindspeed_rl.checkpoint import megatron_layout as ml

COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "grad_norm", "response_length/mean",
            "rollout/staleness_mean", "rollout_correction/is_weight_mean")


@pytest.mark.slow
def test_async_grpo_on_a_rollout_worker_resumes_exactly(tmp_path):
    import ray

    from mindspeed_rl.trainer.launch import train
    from mindspeed_rl.utils.demo_assets import prepare
    from tests.helpers import demo_config

    paths = prepare(str(tmp_path / "assets"), 256)
    keys = {"rl_config.rollout_resource.num_npus": 1, "rl_config.max_head_offpolicyness": 1,
            "megatron_training.global_batch_size": 8, "rl_config.mini_batch_size": 32,
            "megatron_training.test_data_path": "null", "rl_config.test_freq": 0,
            "rl_config.val_before_train": "false", "actor_config.no_load_optim": "false",
            "actor_config.no_load_rng": "false"}
    straight_root, split_root = str(tmp_path / "straight"), str(tmp_path / "split")
    try:
        straight = train(demo_config("grpo_tiny_cpu", straight_root, paths, 3, **keys))
        first = train(demo_config("grpo_tiny_cpu", split_root, paths, 2, **keys))
        state = ml.load_rank(f"{split_root}/ckpt/actor", 0, 0)["trainer_state"]
        second = train(demo_config("grpo_tiny_cpu", split_root, paths, 3, **keys, **{
            "actor_config.finetune": "false", "actor_config.load": f"{split_root}/ckpt/actor"}))
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
