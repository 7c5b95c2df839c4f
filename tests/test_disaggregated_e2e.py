"""The disaggregated layout end to end: GRPO with the actor on one CPU slot and a rollout worker on another,
the actor's weights pushed over the weight channel after every update."""
import pytest


@pytest.mark.slow
def test_grpo_on_a_rollout_worker_of_its_own(tmp_path):
    import ray

    from mindspeed_rl.trainer.launch import train
    from mindspeed_rl.utils.demo_assets import prepare
    from tests.helpers import demo_config

    root = str(tmp_path)
    paths = prepare(str(tmp_path / "assets"), 256)
    try:
        metrics = train(demo_config("grpo_tiny_cpu", root, paths, 2, **{
            "rl_config.rollout_resource.num_npus": 1, "megatron_training.global_batch_size": 8,
            "rl_config.mini_batch_size": 32, "megatron_training.test_data_path": "null",
            "rl_config.test_freq": 0, "rl_config.val_before_train": "false"}))
    finally:
        ray.shutdown()
    trained = [m for m in metrics if m["iteration"] >= 1]
    assert [m["iteration"] for m in trained] == [1, 2]
    for m in trained:
        # the rollout worker sampled with exactly the actor's weights of this iteration (fp32 both sides)
        assert m["rollout/logprob_diff_max"] < 1e-3 and m["rollout/staleness_max"] == 0.0, m
        assert m["timing/weight_sync"] > 0 and "timing/resharding_to_infer" not in m
