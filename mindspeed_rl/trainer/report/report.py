"""The run report: one self-contained HTML file (images embedded) from a run directory; the page itself is
built in ``report_html.py``.

    python -m mindspeed_rl.trainer.report <run_dir>        # writes <run_dir>/report.html

It reads ``run.json`` (config, batch plan, command; written at start) and ``metrics.jsonl``, and shows the
config summary, the batch plan, the final numbers, and curves: score with the validation score, KL, entropy,
response length, the per-phase timing stacked, e2e/update/vllm tokens per second, each evaluation suite's pass@k
and maj@k (eval_config), and the timeline of the
last iterations (``timeline.jsonl``: which worker does what when; asynchronous generation on the rollout
workers shows beside the actor's training). A training run writes it at its end.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .curves import read_metrics
from .eval_curves import evaluation_figures
from .profile_summary import stage_tables
from .report_html import page

RUN_INFO = "run.json"
REPORT = "report.html"

# (title, y label, [(metric, label)])
LINE_PANELS: Sequence[Tuple[str, str, Sequence[Tuple[str, str]]]] = (
    ("Score", "score", (("critic/score/mean", "train score (mean)"), ("val/score/mean", "validation score"))),
    ("KL to the reference", "KL", (("actor/kl_loss", "actor/kl_loss"), ("actor/ppo_kl", "actor/ppo_kl"))),
    ("Entropy", "nats per token", (("actor/entropy", "actor/entropy"),)),
    (
        "Response length",
        "tokens",
        (
            ("response_length/mean", "mean"),
            ("response_length/max", "max"),
            ("response_length/min", "min"),
            ("val/response_length/mean", "validation mean"),
        ),
    ),
    (
        "Throughput",
        "tokens/s per device",
        (("e2e_tps", "e2e_tps"), ("update_tps", "update_tps"), ("vllm_tps", "vllm_tps")),
    ),
)
# the phases inside timing/all, stacked in the order the iteration runs them
TIMING_PHASES = (
    "timing/rollout",
    "timing/rule_reward",
    "timing/reward_model",
    "timing/reference_model",
    "timing/teacher",
    "timing/old_log_p",
    "timing/critic_model",
    "timing/adv",
    "timing/update_critic",
    "timing/update",
    "timing/validation",
)
# (label, dotted key in run.json's config); missing keys are left out
SUMMARY_KEYS = (
    ("model", "megatron_training.model"),
    ("stage", "megatron_training.stage"),
    ("train iterations", "megatron_training.train_iters"),
    ("prompts per iteration", "megatron_training.global_batch_size"),
    ("samples per prompt", "rl.n_samples_per_prompt"),
    ("mini-batch", "rl.mini_batch_size"),
    ("epochs", "rl.epochs"),
    (
        "advantages / policy loss / aggregation",
        ("algorithm.estimator.name", "algorithm.policy_loss.name", "algorithm.loss_agg_mode"),
    ),
    ("actor lr", "actor.megatron.lr"),
    ("critic lr", "critic.megatron.lr"),
    ("KL", ("rl.kl_penalty", "rl.init_kl_coef")),
    ("clip ratio", "rl.clip_ratio"),
    (
        "actor devices / TP / PP",
        (
            "actor.num_devices",
            "actor.megatron.tensor_model_parallel_size",
            "actor.megatron.pipeline_model_parallel_size",
        ),
    ),
    ("precision", "precision.summary"),
    ("rollout backend / infer TP", ("generate.backend", "generate.infer_tensor_parallel_size")),
    ("temperature / top_p", ("generate.sampling_config.temperature", "generate.sampling_config.top_p")),
    ("max new tokens", "generate.sampling_config.max_tokens"),
    ("training data", "megatron_training.data_path"),
    ("test data", "megatron_training.test_data_path"),
    ("validation every (iterations)", "rl.test_freq"),
)


def write_run_info(
    run_dir: str, config: Dict[str, Any], resolved: Dict[str, Any], batch_plan: str, command: Sequence[str]
) -> str:
    """run.json, written when a run starts: the config as given (YAML and overrides), every setting resolved
    (defaults included), the batch plan and the command."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, RUN_INFO)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(
            {
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": list(command),
                "batch_plan": batch_plan,
                "config": config,
                "resolved": resolved,
            },
            fh,
            indent=1,
            default=str,
        )
    return path


def lookup(config: Dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def config_summary(config: Dict[str, Any]) -> List[Tuple[str, str]]:
    rows = []
    for label, key in SUMMARY_KEYS:
        keys = key if isinstance(key, tuple) else (key,)
        values = [lookup(config, k) for k in keys]
        if all(v is None for v in values):
            continue
        rows.append((label, " / ".join("-" if v is None else str(v) for v in values)))
    return rows


def final_numbers(rows: List[Dict[str, float]]) -> List[Tuple[str, str]]:
    """The last iteration's figures, the first and best validation score, the time spent."""
    trained = [r for r in rows if "timing/all" in r]
    if not trained:
        return []
    last = trained[-1]
    out = [("iterations", str(int(last["iteration"])))]
    for key, fmt in (
        ("critic/score/mean", "{:.4f}"),
        ("response_length/mean", "{:.1f}"),
        ("actor/kl_loss", "{:.4g}"),
        ("actor/entropy", "{:.4g}"),
        ("e2e_tps", "{:.0f}"),
        ("update_tps", "{:.0f}"),
        ("vllm_tps", "{:.0f}"),
        ("timing/all", "{:.2f} s"),
    ):
        if key in last:
            out.append((f"{key} (last)", fmt.format(last[key])))
    first_score = trained[0].get("critic/score/mean")
    if first_score is not None and "critic/score/mean" in last:
        out.append(("critic/score/mean (first -> last)", f"{first_score:.4f} -> {last['critic/score/mean']:.4f}"))
    validated = [r for r in rows if "val/score/mean" in r]
    if validated:
        best = max(validated, key=lambda r: r["val/score/mean"])
        out.append(
            (
                "val/score/mean (first -> last)",
                f"{validated[0]['val/score/mean']:.4f} (iteration {int(validated[0]['iteration'])}) -> "
                f"{validated[-1]['val/score/mean']:.4f} (iteration {int(validated[-1]['iteration'])})",
            )
        )
        out.append(("val/score/mean (best)", f"{best['val/score/mean']:.4f} (iteration {int(best['iteration'])})"))
    if any("fleet/engine_failures" in r for r in trained):  # the rollout fleet (rl_config.rollout_fault_tolerance)
        total = {key: sum(r.get(f"fleet/{key}", 0.0) for r in trained) for key in FLEET_TOTALS}
        out.append(("rollout engine faults (run total)", ", ".join(f"{total[k]:g} {k}" for k in FLEET_TOTALS)))
    out.append(("training time (sum of timing/all)", f"{sum(r['timing/all'] for r in trained):.1f} s"))
    return out


FLEET_TOTALS = ("engine_failures", "engine_restarts", "requests_moved", "time_lost_s")


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def figures(rows: List[Dict[str, float]]) -> List[Tuple[str, str]]:
    """(title, base64 PNG) for every panel with data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    for title, ylabel, series in LINE_PANELS:
        present = [(k, label) for k, label in series if any(k in r for r in rows)]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=90)
        for key, label in present:
            points = [(r["iteration"], r[key]) for r in rows if key in r and _finite(r[key])]
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                label=label,
                linewidth=1.5,
                marker="o" if key.startswith("val/") else None,
                markersize=3,
            )
        _finish(ax, title, ylabel)
        fig.tight_layout()
        out.append((title, _png(fig)))
        plt.close(fig)
    trained = [r for r in rows if "timing/all" in r]
    phases = [k for k in TIMING_PHASES if any(k in r for r in trained)]
    if phases:
        fig, ax = plt.subplots(figsize=(7.6, 3.4), dpi=90)
        x = [r["iteration"] for r in trained]
        ax.stackplot(
            x,
            [[r.get(k, 0.0) for r in trained] for k in phases],
            labels=[k.split("/", 1)[1] for k in phases],
            alpha=0.85,
        )
        ax.plot(x, [r["timing/all"] for r in trained], color="black", linewidth=1, label="timing/all")
        _finish(
            ax,
            "Time per iteration by phase (stacked; validation runs outside timing/all, and phases side by side "
            "(blocking: false) add up past it)",
            "seconds",
            legend_outside=True,
        )
        fig.tight_layout()
        out.append(("Timing", _png(fig)))
        plt.close(fig)
    return out


# lanes top to bottom: the roles that do work in an iteration
TIMELINE_LANES = ("actor", "reference", "teacher", "critic", "reward", "driver", "rollout workers")
TIMELINE_PHASES = {  # phase -> (label, colour)
    "timing/rollout": ("generate", "tab:blue"),
    "timing/rollout_wait": ("wait for rollout", "lightgrey"),
    "timing/rule_reward": ("rule reward", "tab:olive"),
    "timing/reward_model": ("reward model", "tab:olive"),
    "timing/reference_model": ("reference", "tab:purple"),
    "timing/teacher": ("teacher", "darkviolet"),
    "timing/old_log_p": ("old log-probs", "tab:cyan"),
    "timing/critic_model": ("values", "tab:brown"),
    "timing/adv": ("advantages", "tab:gray"),
    "timing/update_critic": ("critic update", "tab:pink"),
    "timing/update": ("actor update", "tab:red"),
    "timing/weight_sync": ("weight sync", "tab:orange"),
    "timing/validation": ("validation", "tab:green"),
}


def timeline_figure(timeline: List[Dict], last: int = 4) -> Optional[Tuple[str, str]]:
    """(title, base64 PNG): which worker did what when in the last ``last`` iterations (wall clock, from
    timeline.jsonl); None without spans."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    shown = timeline[-last:]
    spans = [s for row in shown for s in row["spans"]]
    if not spans:
        return None
    origin = min(s[2] for s in spans)
    lanes = [lane for lane in TIMELINE_LANES if any(s[0] == lane for s in spans)]
    lanes += sorted({s[0] for s in spans} - set(lanes))
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(lanes) + 1.6), dpi=90)
    used = {}
    for lane_index, lane in enumerate(reversed(lanes)):
        for s_lane, phase, start, end in spans:
            if s_lane != lane:
                continue
            label, colour = TIMELINE_PHASES.get(phase, (phase.split("/", 1)[-1], "black"))
            ax.broken_barh([(start - origin, max(end - start, 1e-3))], (lane_index - 0.35, 0.7), color=colour)
            used[label] = colour
    for row in shown:
        ax.axvline(row["start"] - origin, color="black", linewidth=0.8, linestyle="--")
        ax.text(row["start"] - origin, len(lanes) - 0.45, f" it {row['iteration']}", fontsize=7, va="bottom")
    ax.set_yticks(range(len(lanes)), list(reversed(lanes)))
    ax.set_xlabel("seconds")
    ax.set_title(f"Timeline of the last {len(shown)} iteration(s): which worker does what when")
    ax.legend(
        handles=[Patch(color=c, label=lane) for lane, c in used.items()],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = ("Timeline", _png(fig))
    plt.close(fig)
    return out


def read_timeline(path: str) -> List[Dict]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _finish(ax, title: str, ylabel: str, legend_outside: bool = False) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if legend_outside:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=7)


def render(run_dir: str) -> str:
    """Write ``<run_dir>/report.html``; returns its path. Raises FileNotFoundError without metrics.jsonl."""
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics_path):
        raise FileNotFoundError(f"{metrics_path}: no metrics (is {run_dir} a run directory?)")
    rows = read_metrics(metrics_path)
    info: Dict[str, Any] = {}
    info_path = os.path.join(run_dir, RUN_INFO)
    if os.path.isfile(info_path):
        with open(info_path, encoding="utf-8") as fh:
            info = json.load(fh)
    resolved = info.get("resolved") or {}
    plots = figures(rows) + evaluation_figures(rows, _png)
    timeline = timeline_figure(read_timeline(os.path.join(run_dir, "timeline.jsonl")))
    if timeline is not None:
        plots.append(timeline)
    iterations = len([r for r in rows if "timing/all" in r])
    summary = config_summary(resolved) if resolved else None
    text = page(run_dir, info, iterations, final_numbers(rows), summary, plots, stage_tables(run_dir))
    path = os.path.join(run_dir, REPORT)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m mindspeed_rl.trainer.report <run_dir>", file=sys.stderr)
        return 2
    try:
        print(render(args[0]))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
