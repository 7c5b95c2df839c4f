"""Per-iteration output: one compact console line (every metric by name too with
``rl_config.console_metrics``), one JSON line in metrics.jsonl, tensorboard, wandb and SwanLab."""

from __future__ import annotations

import json
import os
from typing import Dict

from .metrics import CONSOLE_FIGURES, KEY_FIGURES


class MetricsLogger:
    """Console, metrics.jsonl, and optionally tensorboard (every metric as a scalar), wandb and SwanLab."""

    def __init__(self, run_dir: str, total_iterations: int, rl=None, config: Dict = None):
        self.run_dir, self.total = run_dir, total_iterations
        self.full_console = bool(getattr(rl, "console_metrics", False))
        self.step_seconds: list = []
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tensorboard = self.wandb = self.swanlab = None
        if rl is not None and rl.use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if rl is not None and rl.use_wandb:
            import wandb

            os.makedirs(rl.wandb_save_dir, exist_ok=True)
            mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            self.wandb = wandb.init(
                project=rl.wandb_project, name=rl.wandb_exp_name, dir=rl.wandb_save_dir, mode=mode, config=config or {}
            )
        if rl is not None and rl.use_swanlab:
            self.swanlab = open_swanlab(rl, config)

    def log(self, metrics: Dict[str, float]) -> None:
        """One iteration: the console line (and every metric with console_metrics), then ``record``."""
        print(self.console_line(metrics), flush=True)
        ordered = self.record(metrics)
        if self.full_console:
            print(
                "  " + ", ".join(f"{k}: {v:.6g}" if isinstance(v, float) else f"{k}: {v}" for k, v in ordered.items()),
                flush=True,
            )

    def record(self, metrics: Dict[str, float]) -> Dict[str, float]:
        """metrics.jsonl, tensorboard and wandb only (e.g. the validation before training, iteration 0)."""
        it = int(metrics["iteration"])
        ordered = {k: metrics[k] for k in KEY_FIGURES if k in metrics}
        ordered.update({k: metrics[k] for k in sorted(metrics) if k not in ordered})
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(ordered) + "\n")
        if self.tensorboard is not None:
            for key, value in ordered.items():
                if key != "iteration" and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, it)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in ordered.items() if k != "iteration"}, step=it)
        if self.swanlab is not None:
            self.swanlab.log(
                {k: v for k, v in ordered.items() if k != "iteration" and isinstance(v, (int, float))}, step=it
            )
        return ordered

    def timeline(self, iteration: int, start: float, end: float, spans) -> None:
        """One line of timeline.jsonl: the iteration's wall-clock window and its spans (lane, phase, start,
        end), drawn by the run report."""
        with open(os.path.join(self.run_dir, "timeline.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps({"iteration": iteration, "start": start, "end": end, "spans": [list(s) for s in spans]})
                + "\n"
            )

    def console_line(self, metrics: Dict[str, float]) -> str:
        """iter 3/20 | score 0.133 | kl 0.136 | len 15.9 | step 2.66s | e2e_tps 1413 | ETA 45s"""
        it = int(metrics["iteration"])
        parts = [f"iter {it}/{self.total}"]
        parts += [f"{label} {fmt.format(metrics[key])}" for label, key, fmt in CONSOLE_FIGURES if key in metrics]
        if "timing/all" in metrics:
            self.step_seconds.append(float(metrics["timing/all"]))
            recent = self.step_seconds[-5:]
            parts.append(f"ETA {readable_seconds(sum(recent) / len(recent) * (self.total - it))}")
        return " | ".join(parts)

    def close(self) -> None:
        """Flush the writers, draw the curves (reward, response length, timing) as PNG and write the
        HTML run report."""
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.swanlab is not None:
            self.swanlab.finish()
        if os.path.isfile(self.path):
            from .curves import draw
            from .report import render

            for path in draw(self.run_dir):
                print(f"curve: {path}", flush=True)
            print(f"report: {render(self.run_dir)}", flush=True)


def open_swanlab(rl, config: Dict = None):
    """A SwanLab run in ``rl.swanlab_save_dir``; its mode from ``rl_config.swanlab`` (cloud = online)."""
    import swanlab

    from ...config_cls.logging_config import SWANLAB_MODES

    os.makedirs(rl.swanlab_save_dir, exist_ok=True)
    return swanlab.init(
        project=rl.swanlab_project,
        experiment_name=rl.swanlab_exp_name,
        logdir=rl.swanlab_save_dir,
        mode=SWANLAB_MODES[rl.swanlab],
        config=config or {},
    )


def readable_seconds(seconds: float) -> str:
    """45s, 3m05s, 2h07m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
