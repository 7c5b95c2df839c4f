"""The tool-use CPU twin (grpo_tiny_cpu_tools) on the whole pipeline (Ray + megatron-core + vLLM on CPU, the
sandbox): the tool agent runs the cold-start model's calculator calls once each, the results enter the
trajectories with loss_mask 0, the metrics and the run report's timeline are written. The cold-start SFT
model is made once per session (about 1.5 minutes), the run of 3 iterations takes about a minute.
"""
import glob
import json
import os

import pytest

from tests.helpers import demo_config

ITERATIONS = 3
ACCURACY = "acc_for_ppo_rewards/mean"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from mindspeed_rl.utils.tool_demo import prepare_tool_task

    root = str(tmp_path_factory.mktemp("tools"))
    return root, prepare_tool_task(root)


@pytest.mark.slow
def test_the_tool_agent_runs_calls_on_the_whole_pipeline(assets):
    import ray

    from mindspeed_rl.trainer.launch import train

    root, paths = assets
    cfg = demo_config("grpo_tiny_cpu_tools", root, paths, ITERATIONS, **{"actor_config.load": paths["mcore"],
                                                                        "rl_config.test_freq": 3})
    try:
        history = train(cfg)
    finally:
        ray.shutdown()
    assert sum(m["tool_calls/rate"] for m in history) > 0, [m["tool_calls/rate"] for m in history]
    for m in history:
        assert m["tool_calls/mean"] <= 1.0 and m["tool_calls/errors"] <= m["tool_calls/mean"] * 64
        assert m["tool_calls/timeouts"] == 0 and m["timing/tool"] >= 0
        assert 1.0 <= m["multi_turn/num_turns/mean"] <= 2.0
        assert m["response_length/mean"] >= m["multi_turn/generated_tokens/mean"]
    assert max(m["multi_turn/observation_tokens/mean"] for m in history) > 0
    assert ACCURACY in history[-1]
    # the run report draws the timeline of the last iterations
    run_dir = max(glob.glob(os.path.join(cfg.rl.log_dir, "*", "timeline.jsonl")), key=os.path.getmtime)[:-len("/timeline.jsonl")]
    with open(os.path.join(run_dir, "timeline.jsonl")) as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == ITERATIONS and {s[1] for s in rows[-1]["spans"]} >= {"timing/rollout", "timing/update"}
    assert "alt='Timeline'" in open(os.path.join(run_dir, "report.html"), encoding="utf-8").read()
