"""The tool-use CPU twin (grpo_tiny_cpu_tools) learns to use its tool on the whole pipeline (Ray +
megatron-core + vLLM on CPU, the sandbox): the cold-start model calls the calculator in a few of its answers;
the tool agent runs the calls once each, the results enter the trajectories with loss_mask 0, and GRPO turns
the tool into the habit: the tool-call rate and the accuracy rise from near 0 within 12 iterations. The
metrics and the run report's timeline are written. The cold-start SFT takes about a minute, the run 80 s.
(The control that cannot call the tool stays at guessing: bench/tool_learning.py.)
"""

import glob
import json
import os

import pytest

from tests.helpers import demo_config

ITERATIONS = 12
ACCURACY = "acc_for_ppo_rewards/mean"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from mindspeed_rl.utils.tool_demo import prepare_tool_task

    root = str(tmp_path_factory.mktemp("tools"))
    return root, prepare_tool_task(root)


@pytest.mark.slow
def test_the_tool_agent_learns_to_use_the_calculator(assets):
    import ray

    from mindspeed_rl.trainer.launch import train

    root, paths = assets
    cfg = demo_config(
        "grpo_tiny_cpu_tools",
        root,
        paths,
        ITERATIONS,
        **{"actor_config.load": paths["mcore"], "rl_config.test_freq": 6},
    )
    try:
        history = train(cfg)
    finally:
        ray.shutdown()
    accuracy = [round(m[ACCURACY], 3) for m in history]
    calls = [round(m["tool_calls/rate"], 3) for m in history]
    # learning: the last three iterations use the tool and are right far more often than the first three
    # (measured: accuracy 0.06 -> 0.66, tool-call rate 0.06 -> 0.66; a guess is right once in ~9000)
    first, last = (lambda xs: sum(xs[:3]) / 3), (lambda xs: sum(xs[-3:]) / 3)
    assert first(accuracy) < 0.2 and last(accuracy) > max(0.3, first(accuracy) + 0.2), (accuracy, calls)
    assert last(calls) > max(0.3, first(calls) + 0.2), (accuracy, calls)
    assert history[-1]["val/score/mean"] >= history[5]["val/score/mean"], accuracy
    for m in history:
        assert m["tool_calls/mean"] <= 1.0 and m["tool_calls/errors"] <= m["tool_calls/mean"] * 128
        assert m["tool_calls/timeouts"] == 0 and m["timing/tool"] >= 0
        assert 1.0 <= m["multi_turn/num_turns/mean"] <= 2.0
        assert m["response_length/mean"] >= m["multi_turn/generated_tokens/mean"]
    assert max(m["multi_turn/observation_tokens/mean"] for m in history) > 0
    # the run report draws the timeline of the last iterations
    run_dir = max(glob.glob(os.path.join(cfg.rl.log_dir, "*", "timeline.jsonl")), key=os.path.getmtime)[
        : -len("/timeline.jsonl")
    ]
    with open(os.path.join(run_dir, "timeline.jsonl")) as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == ITERATIONS and {s[1] for s in rows[-1]["spans"]} >= {"timing/rollout", "timing/update"}
    assert "alt='Timeline'" in open(os.path.join(run_dir, "report.html"), encoding="utf-8").read()
