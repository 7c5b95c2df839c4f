"""Per-iteration output: a one-line summary, every metric by name, one JSON line in metrics.jsonl."""
from __future__ import annotations

import json
import os
from typing import Dict

from .metrics import KEY_FIGURES


class MetricsLogger:
    """Console, metrics.jsonl, and optionally tensorboard (every metric as a scalar) and wandb."""

    def __init__(self, run_dir: str, total_iterations: int, rl=None, config: Dict = None):
        self.run_dir, self.total = run_dir, total_iterations
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tensorboard = self.wandb = None
        if rl is not None and rl.use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if rl is not None and rl.use_wandb:
            import wandb

            os.makedirs(rl.wandb_save_dir, exist_ok=True)
            mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            self.wandb = wandb.init(project=rl.wandb_project, name=rl.wandb_exp_name, dir=rl.wandb_save_dir,
                                    mode=mode, config=config or {})

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
        if self.tensorboard is not None:
            for key, value in ordered.items():
                if key != "iteration" and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, it)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in ordered.items() if k != "iteration"}, step=it)

    def close(self) -> None:
        """Flush the writers and draw the curves (reward, response length, timing) as PNG."""
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
        if os.path.isfile(self.path):
            from .curves import draw

            for path in draw(self.run_dir):
                print(f"curve: {path}", flush=True)
