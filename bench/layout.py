"""What the 32B recipe's layout costs at CPU scale: the 1-slot demo vs the x4 twin on the same work.

    .venv/bin/python bench/layout.py [--iterations 6] [--configs ppo_tiny_cpu ppo_tiny_cpu_x4]

Runs `cli/train_ppo.py --config-name <config>` (the user's command) for each config with the same batch
(16 prompts x 8 samples, mini-batch 64, up to 16 new tokens), reads the run's metrics.jsonl, and prints a
markdown table: start-up (Ray start to workers ready: the log line "workers ready in"), the whole
command's wall time, then the median over iterations 2..N of each
phase. The first iteration is a warm-up and is left out of the medians.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.train_run import train  # noqa: E402

PHASES = (
    "timing/all",
    "timing/rollout",
    "timing/resharding_to_infer",
    "timing/reference_model",
    "timing/old_log_p",
    "timing/critic_model",
    "timing/rule_reward",
    "timing/adv",
    "timing/update_critic",
    "timing/update",
    "e2e_tps",
    "update_tps",
    "vllm_tps",
    "rollout/logprob_diff_max",
)


def run(config: str, iterations: int, work: str) -> dict:
    overrides = [
        f"megatron_training.train_iters={iterations}",
        "megatron_training.global_batch_size=16",
        "rl_config.mini_batch_size=64",
        f"rl_config.log_dir={work}/{config}/logs",
        f"actor_config.save={work}/{config}/actor",
        f"critic_config.save={work}/{config}/critic",
        "megatron_training.save_interval=1000",
    ]
    done = train(config, overrides, config, env=dict(os.environ, NPUS_PER_NODE="4"))
    ready = re.search(r"workers ready in ([0-9.]+)s", done.stdout)
    measured = done.rows[1:] or done.rows
    result = {k: statistics.median(r[k] for r in measured) for k in PHASES if k in measured[0]}
    result["start-up"] = float(ready.group(1)) if ready else float("nan")
    result["wall"] = done.wall
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--configs", nargs="+", default=["ppo_tiny_cpu", "ppo_tiny_cpu_x4"])
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_layout_") as work:
        results = {c: run(c, args.iterations, work) for c in args.configs}
    print("| phase | " + " | ".join(args.configs) + " |")
    print("|---|" + "---|" * len(args.configs))
    for key in ("start-up", "wall") + PHASES:
        cells = []
        for config in args.configs:
            value = results[config].get(key)
            cells.append(
                "-"
                if value is None
                else (f"{value:.2e}" if "diff" in key else f"{value:,.0f}" if "tps" in key else f"{value:.2f} s")
            )
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
