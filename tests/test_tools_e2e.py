"""The tool-use CPU twin (grpo_tiny_cpu_tools) on the whole pipeline (Ray + megatron-core + vLLM on CPU, the
sandbox): the tool agent runs the model's calculator calls, the results enter the trajectories with
loss_mask 0, and the model learns to call the tool: the tool-call rate and the accuracy rise. The cold-start
SFT model is made once per session (about 1.5 minutes), the run takes about 1.5 minutes.
"""
import json
import os

import pytest

from tests.helpers import demo_config

ITERATIONS = 10
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
    cfg = demo_config("grpo_tiny_cpu_tools", root, paths, ITERATIONS, **{"actor_config.load": paths["mcore"],
                                                                        "rl_config.test_freq": 0})
    try:
        history = train(cfg)
    finally:
        ray.shutdown()
    rate = [m["tool_calls/rate"] for m in history]
    accuracy = [m[ACCURACY] for m in history]
    assert sum(rate[-3:]) / 3 > sum(rate[:2]) / 2 + 0.2, rate
    assert sum(accuracy[-3:]) / 3 > sum(accuracy[:2]) / 2 + 0.15, accuracy
    for m in history:
        assert m["tool_calls/timeouts"] == 0 and m["timing/tool"] >= 0
        assert 1.0 <= m["multi_turn/num_turns/mean"] <= 2.0
        assert m["response_length/mean"] >= m["multi_turn/generated_tokens/mean"]
    assert history[-1]["multi_turn/observation_tokens/mean"] > 0
    # the run report draws the timeline of the last iterations
    run_dir = cfg.rl.log_dir
    with open(os.path.join(run_dir, "timeline.jsonl")) as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == ITERATIONS and {s[1] for s in rows[-1]["spans"]} >= {"timing/rollout", "timing/update"}
    assert "alt='Timeline'" in open(os.path.join(run_dir, "report.html"), encoding="utf-8").read()
