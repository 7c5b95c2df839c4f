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
    control = control_run  # 3 iterations are enough to show that nothing moves (validated at 2 and 3)
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
    assert report.count("data:image/png;base64,") == 8 and "<th>iterations</th><td>20</td>" in report
    assert "alt='Timeline'" in report  # the six curves, the evaluation suite's and the timeline
    assert "alt='Evaluation: lucky'" in report
    assert "RotaryEmbedding" in open(os.path.join(run, "logs", "actor_0.log")).read()  # vLLM's chatter: in the file
    # save_hf: the HF folder beside the last checkpoint
    hf_dir = os.path.join(root, "ckpt", "actor", f"iter_{ITERATIONS:07d}_hf")
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(hf_dir))


@pytest.mark.slow
def test_a_suite_evaluated_during_training_means_the_same_as_on_the_saved_checkpoint(
    learned_run, demo_assets, tmp_path
):
    """eval_config (conftest's LEARNED_EVALUATION: the held-out questions as raw rows, 4 samples each, before training
    and every 10 iterations on the rollout engines) rises with training, and cli/evaluate.py on the checkpoint
    saved at iteration 20 (a training checkpoint: exported for vLLM with the run's tokenizer) finds the same
    numbers within sampling noise: the same suite, scorer and estimators."""
    import subprocess

    from tests.conftest import PYTHON, ROOT

    root, learned = learned_run
    run = os.path.join(root, "logs", sorted(os.listdir(os.path.join(root, "logs")))[0])
    rows = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    evals = {r["iteration"]: r for r in rows if "eval/lucky/pass@1" in r}
    assert sorted(evals) == [0, 10, 20], sorted(evals)
    keys = {f"eval/lucky/{m}@{k}" for m in ("pass", "maj") for k in (1, 2, 4)}
    assert keys | {"eval/lucky/mean@4", "eval/lucky/truncated/rate", "timing/evaluation"} <= set(evals[20])
    first, last = evals[0]["eval/lucky/pass@1"], evals[20]["eval/lucky/pass@1"]
    assert first < 0.2 and last > max(0.5, first + 0.3), (first, last)
    assert evals[20]["eval/lucky/pass@4"] >= evals[20]["eval/lucky/pass@1"]
    out = tmp_path / "eval"
    command = [PYTHON, "cli/evaluate.py", "--model", os.path.join(root, "ckpt", "actor")]
    command += ["--tokenizer", demo_assets["tokenizer"], "--suite", f"lucky={demo_assets['raw_test']}"]
    command += ["--prompt-type", "empty", "--n", "4", "--max-new-tokens", "16", "--max-prompt-length", "48"]
    command += ["--max-model-len", "96", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lucky" in done.stdout and "pass@4" in done.stdout  # the table
    result = json.load(open(out / "results.json"))
    cli = result["suites"]["lucky"]["metrics"]
    assert result["engine"] == "vllm" and cli["problems"] == 64
    for key in ("pass@1", "pass@4", "maj@4"):  # 256 samples either way; different seeds
        assert abs(cli[key] - evals[20][f"eval/lucky/{key}"]) <= 0.1, (key, cli, evals[20])
    samples = [json.loads(x) for x in open(out / "lucky.samples.jsonl")]
    assert len(samples) == 64 and all(len(s["responses"]) == 4 for s in samples)
    assert (out / "lucky.png").stat().st_size > 10_000
