"""Reward, response-length, preference-accuracy, SFT-loss and timing curves as PNG, drawn from metrics.jsonl.

python -m mindspeed_rl.trainer.report.curves <run_dir or metrics.jsonl>
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List

PANELS = [
    ("reward", ["critic/score/mean", "critic/score/max", "critic/score/min"]),
    ("response_length", ["response_length/mean", "response_length/max", "response_length/min"]),
    ("preference_accuracy", ["rm/accuracy", "val/rm/accuracy", "rewards/accuracies", "val/rewards/accuracies"]),
    ("sft_loss", ["sft/loss", "val/sft/loss"]),
    (
        "timing",
        [
            "timing/all",
            "timing/rollout",
            "timing/update",
            "timing/update_critic",
            "timing/old_log_p",
            "timing/reference_model",
            "timing/teacher",
            "timing/critic_model",
        ],
    ),
]


def read_metrics(path: str) -> List[Dict[str, float]]:
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    print(f"skipped {path}:{number}: not JSON (a run killed while writing?)", file=sys.stderr)
    return rows


def draw(run_dir: str) -> List[str]:
    """Write the panels with data (reward.png, response_length.png, preference_accuracy.png, timing.png) into
    ``run_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        return []
    out_dir = run_dir if os.path.isdir(run_dir) else os.path.dirname(run_dir)
    x = [r["iteration"] for r in rows]
    written = []
    for name, keys in PANELS:
        if not any(key in r for r in rows for key in keys):
            continue  # a panel of another kind of run (reward-model training draws no response lengths)
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        for key in keys:
            if any(key in r for r in rows):
                ax.plot(x, [r.get(key, float("nan")) for r in rows], label=key, linewidth=1.5)
        ax.set_xlabel("iteration")
        ax.set_ylabel("seconds" if name == "timing" else name.replace("_", " "))
        ax.set_title(name.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{name}.png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not os.path.exists(args[0]):
        print("usage: python -m mindspeed_rl.trainer.report.curves <run_dir or metrics.jsonl>", file=sys.stderr)
        return 2
    for path in draw(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
