"""Per-iteration output: a one-line summary, every metric by name, one JSON line in metrics.jsonl."""
from __future__ import annotations

import json
import os
from typing import Dict

from .metrics import KEY_FIGURES


class MetricsLogger:
    def __init__(self, run_dir: str, total_iterations: int):
        self.run_dir, self.total = run_dir, total_iterations
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")

    def log(self, metrics: Dict[str, float]) -> None:
        it = int(metrics["iteration"])
        head = [f"iter {it}/{self.total}"]
        for key in KEY_FIGURES[1:]:
            if key in metrics:
                head.append(f"{key} {metrics[key]:.4g}")
        print(" | ".join(head), flush=True)
        ordered = {k: metrics[k] for k in KEY_FIGURES if k in metrics}
        ordered.update({k: metrics[k] for k in sorted(metrics) if k not in ordered})
        print("  " + ", ".join(f"{k}: {v:.6g}" if isinstance(v, float) else f"{k}: {v}" for k, v in ordered.items()),
              flush=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(ordered) + "\n")

    def close(self) -> None:
        return None
