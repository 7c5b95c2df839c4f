"""End to end on ppo_tiny_cpu (Ray + megatron-core + vLLM on CPU): PPO raises the mean reward of a
randomly initialised policy on the lucky-number task, and a control run without policy updates does not (the
suite's one control, conftest's ``control_run``).
"""

import json
import os

import pytest

from tests.conftest import LEARNED_ITERATIONS as ITERATIONS


@pytest.mark.slow
def test_ppo_learns_and_the_control_run_does_not(learned_run, control_run):
    root, learned = learned_run  # the demo's 20 iterations (conftest: the distillation test's teacher too)
    control = control_run  # 6 iterations are enough to show that nothing moves (validated at 5 and 6)
    scores = [m["critic/score/mean"] for m in learned]
    control_scores = [m["critic/score/mean"] for m in control]
    start, end = sum(scores[:2]) / 2, sum(scores[-3:]) / 3
    assert start < 0.1, scores
    assert end > 0.5, scores
    assert max(control_scores) < 0.2, control_scores
    # validation on the held-out prompts (greedy) every 5 iterations and at the end: it rises with training
    val = {m["iteration"]: m["val/score/mean"] for m in learned if "val/score/mean" in m}
    assert sorted(val) == [5, 10, 15, 20], val
    # the control run keeps the initial weights: its validation is where the learned run started
    control_val = [m["val/score/mean"] for m in control if "val/score/mean" in m]
    assert val[20] > 0.5 and max(control_val) < 0.2, (val, control_val)
    assert {"val/acc_for_ppo/mean@1", "val/pass@1", "val/response_length/mean"} <= set(learned[-1])
    # every documented metric is logged, with the throughput formulas applied
    m = learned[-1]
    for key in (
        "timing/all",
        "timing/update",
        "timing/rollout",
        "timing/old_log_p",
        "timing/reference_model",
        "timing/resharding_to_train",
        "timing/resharding_to_infer",
        "timing/adv",
        "timing/critic_model",
        "timing/update_critic",
        "timing/rule_reward",
        "actor/entropy",
        "actor/kl_loss",
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/lr",
        "critic/lr",
        "grad_norm",
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "acc_for_ppo_rewards/mean",
        "critic/score/mean",
        "critic/score/max",
        "critic/score/min",
        "critic/rewards/mean",
        "critic/advantages/mean",
        "critic/returns/mean",
        "critic/values/mean",
        "response_length/mean",
        "response_length/max",
        "response_length/min",
        "prompt_length/mean",
        "prompt_length/max",
        "prompt_length/min",
        "e2e_tps",
        "update_tps",
        "vllm_tps",
        "rollout/logprob_diff_mean",
        "rollout/logprob_diff_max",
    ):
        assert key in m, key
    tokens = (m["response_length/mean"] + m["prompt_length/mean"]) * 16 * 8
    assert m["e2e_tps"] == pytest.approx(tokens / m["timing/all"])
    assert m["vllm_tps"] == pytest.approx(tokens / m["timing/rollout"])
    # vLLM and megatron agree on the sampled tokens (bf16 on both sides: measured 0.026 at most; fp32 ~1e-6)
    assert m["rollout/logprob_diff_max"] < 0.1 and m["rollout/logprob_diff_mean"] < 0.01
    runs = sorted(os.listdir(os.path.join(root, "logs")))
    lines = [json.loads(x) for x in open(os.path.join(root, "logs", runs[0], "metrics.jsonl"))]
    assert [x["iteration"] for x in lines] == list(range(0, ITERATIONS + 1))  # 0: validation before training
    run = os.path.join(root, "logs", runs[0])
    report = open(os.path.join(run, "report.html"), encoding="utf-8").read()  # the run report, at the end
    assert report.count("data:image/png;base64,") == 7 and "<th>iterations</th><td>20</td>" in report
    assert "alt='Timeline'" in report  # the six curves and the timeline of the last iterations
    assert "RotaryEmbedding" in open(os.path.join(run, "logs", "actor_0.log")).read()  # vLLM's chatter: in the file
    # save_hf: the HF folder beside the last checkpoint
    hf_dir = os.path.join(root, "ckpt", "actor", f"iter_{ITERATIONS:07d}_hf")
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(hf_dir))
