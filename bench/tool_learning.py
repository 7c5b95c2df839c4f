"""Learning to use a tool: the multiply task with the tool agent vs a control that cannot call the tool, and the
same task played by agents outside the trainer.

    .venv/bin/python bench/tool_learning.py [--iterations 12] [--seeds 1 2 3] [--runs tools control] [key=value ...]

Every run starts from the same cold-start model (``cli/prepare_demo.py --tools``, made once under --root) and
goes through ``cli/train_ppo.py --config-name <config>`` (the user's command):
  tools         grpo_tiny_cpu_tools, rollout_function=tool_agent: a calculator call is run in the sandbox, answered
  control       grpo_tiny_cpu_tools, rollout_function=single_turn: the same prompts, a call never answered
  openai_agent  grpo_tiny_cpu_openai_agent: examples/agents/calculator_agent.py through the policy endpoint
  verifiers     grpo_tiny_cpu_verifiers: the task as a verifiers environment, one harness process (.venv-agents)
Extra key=value overrides go to every run. Prints a markdown table per seed and iteration: accuracy
(acc_for_ppo_rewards/mean, or the agents' episode/reward/mean) and the tool-call rate of each run (the agents':
the share of episodes with a second turn), then the validation score and the wall time of each command.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.train_run import train  # noqa: E402

# name -> (config, its overrides, the accuracy metric)
RUNS = {
    "tools": ("grpo_tiny_cpu_tools", ["rl_config.rollout_function=tool_agent"], "acc_for_ppo_rewards/mean"),
    "control": ("grpo_tiny_cpu_tools", ["rl_config.rollout_function=single_turn"], "acc_for_ppo_rewards/mean"),
    "openai_agent": ("grpo_tiny_cpu_openai_agent", [], "episode/reward/mean"),
    "verifiers": ("grpo_tiny_cpu_verifiers", [], "episode/reward/mean"),
}


def run(name: str, iterations: int, seed: int, work: str, overrides) -> dict:
    out = os.path.join(work, f"{name}_seed{seed}")
    config, keys, accuracy = RUNS[name]
    agents = config != "grpo_tiny_cpu_tools"  # scored by the agents: no validation (the verifiers' score would be 0)
    done = train(
        config,
        [
            *keys,
            f"megatron_training.train_iters={iterations}",
            f"megatron_training.seed={seed}",
            f"generate_config.sampling_config.seed={seed}",
            f"rl_config.log_dir={out}/logs",
            f"actor_config.save={out}/actor",
            "megatron_training.save_interval=1000",
            f"rl_config.test_freq={0 if agents else iterations}",
            *overrides,
        ],
        f"{name} (seed {seed})",
    )
    rows = [r for r in done.rows if accuracy in r]
    calls = [r["episodes/turns/mean"] - 1 if agents else r.get("tool_calls/rate", 0.0) for r in rows]
    return {
        "accuracy": [r[accuracy] for r in rows],
        "calls": calls,
        "val": [r["val/score/mean"] for r in rows if "val/score/mean" in r],
        "wall": done.wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=["tools", "control"])
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runs")
    args = parser.parse_args()
    from mindspeed_rl.demo.tool_task import prepare_tool_task

    prepare_tool_task(os.path.join(ROOT, "demo_assets"))  # where grpo_tiny_cpu_tools.yaml looks
    with tempfile.TemporaryDirectory() as work:
        for seed in args.seeds:
            results = {name: run(name, args.iterations, seed, work, args.overrides) for name in args.runs}
            columns = [
                (name, key)
                for name in results
                for key in ("accuracy", "calls")
                if key == "accuracy" or name != "control"
            ]
            print(
                f"\nseed {seed}\n\n| iteration | "
                + " | ".join(f"{'tool-call rate' if key == 'calls' else 'accuracy'} ({name})" for name, key in columns)
                + " |"
            )
            print("|---" * (len(columns) + 1) + "|")
            for i in range(args.iterations):
                print(f"| {i + 1} | " + " | ".join(f"{results[n][k][i]:.3f}" for n, k in columns) + " |")
            for name, r in results.items():
                print(f"\n{name}: validation score {r['val']}, command {r['wall']:.0f} s")


if __name__ == "__main__":
    main()
