"""Learning to use a tool: the multiply task with the tool agent vs a control that cannot call the tool.

    .venv/bin/python bench/tool_learning.py [--iterations 12] [--seeds 1 2 3] [--runs tools control] [key=value ...]

Both runs start from the same cold-start model (``cli/prepare_demo.py --tools``, made once under --root) and
go through ``cli/train_ppo.py --config-name grpo_tiny_cpu_tools`` (the user's command):
  tools    rl_config.rollout_function=tool_agent: a calculator call is run in the sandbox and answered
  control  rl_config.rollout_function=single_turn: the same prompts, but a call is never answered
Extra key=value overrides go to both runs. Prints a markdown table per seed and iteration: accuracy
(acc_for_ppo_rewards/mean) and the tool-call rate of each run,
then the validation score and the wall time of each command.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.train_run import train  # noqa: E402

RUNS = {"tools": "tool_agent", "control": "single_turn"}


def run(name: str, iterations: int, seed: int, work: str, overrides) -> dict:
    out = os.path.join(work, f"{name}_seed{seed}")
    done = train(
        "grpo_tiny_cpu_tools",
        [
            f"rl_config.rollout_function={RUNS[name]}",
            f"megatron_training.train_iters={iterations}",
            f"megatron_training.seed={seed}",
            f"generate_config.sampling_config.seed={seed}",
            f"rl_config.log_dir={out}/logs",
            f"actor_config.save={out}/actor",
            "megatron_training.save_interval=1000",
            f"rl_config.test_freq={iterations}",
            *overrides,
        ],
        f"{name} (seed {seed})",
    )
    rows = [r for r in done.rows if "acc_for_ppo_rewards/mean" in r]
    return {
        "accuracy": [r["acc_for_ppo_rewards/mean"] for r in rows],
        "calls": [r.get("tool_calls/rate", 0.0) for r in rows],
        "val": [r["val/score/mean"] for r in rows if "val/score/mean" in r],
        "wall": done.wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=list(RUNS))
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runs")
    args = parser.parse_args()
    from mindspeed_rl.demo.tool_task import prepare_tool_task

    prepare_tool_task(os.path.join(ROOT, "demo_assets"))  # where grpo_tiny_cpu_tools.yaml looks
    with tempfile.TemporaryDirectory() as work:
        for seed in args.seeds:
            results = {name: run(name, args.iterations, seed, work, args.overrides) for name in args.runs}
            columns = [
                (name, key) for name in results for key in ("accuracy", "calls") if key == "accuracy" or name == "tools"
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
