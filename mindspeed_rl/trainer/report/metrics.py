"""Metric names as MindSpeed-RL documents them, and the throughput formulas."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from ...algorithms import masked_mean
from ...protocol import Experience
from ...utils.clock import Clock

KEY_FIGURES = (
    "iteration",
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "critic/vf_loss",
    "actor/kl_loss",
    "grad_norm",
    "timing/all",
    "e2e_tps",
)

# the compact console line: (label, metric key, format); a key absent this iteration is left out
CONSOLE_FIGURES = (
    ("score", "critic/score/mean", "{:.3f}"),
    ("val", "val/score/mean", "{:.3f}"),
    ("kl", "actor/kl_loss", "{:.3g}"),
    ("teacher_kl", "distill/teacher_kl", "{:.3g}"),
    ("len", "response_length/mean", "{:.1f}"),
    ("loss", "rm/loss", "{:.4f}"),
    ("acc", "rm/accuracy", "{:.3f}"),
    ("val_acc", "val/rm/accuracy", "{:.3f}"),
    ("loss", "sft/loss", "{:.4f}"),
    ("val_loss", "val/sft/loss", "{:.4f}"),
    ("val_ppl", "val/sft/ppl", "{:.3g}"),
    ("loss", "dpo/loss", "{:.4f}"),
    ("acc", "rewards/accuracies", "{:.3f}"),
    ("margin", "rewards/margins", "{:.3g}"),
    ("val_acc", "val/rewards/accuracies", "{:.3f}"),
    ("step", "timing/all", "{:.2f}s"),
    ("e2e_tps", "e2e_tps", "{:.0f}"),
)


def _stats(prefix: str, values: torch.Tensor) -> Dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> Dict[str, float]:
    sel = values[mask.bool()]
    if sel.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {
        f"{prefix}/mean": float(masked_mean(values, mask)),
        f"{prefix}/max": float(sel.max()),
        f"{prefix}/min": float(sel.min()),
    }


def data_metrics(exp: Experience, version: int = 0) -> Dict[str, float]:
    """Score, reward, advantage, return and value statistics over the loss tokens; lengths over all response
    tokens; rollout staleness (``version`` minus the version that sampled each loss token)."""
    mask, length_mask = exp.loss_mask, exp.response_mask
    out: Dict[str, float] = {}
    out.update(_stats("critic/score", exp.scores))
    out.update(_stats("critic/rewards", (exp.token_rewards * mask).sum(1)))
    out.update(_masked_stats("critic/advantages", exp.advantages, mask))
    out.update(_masked_stats("critic/returns", exp.returns, mask))
    if exp.values is not None:
        out.update(_masked_stats("critic/values", exp.values, mask))
    out.update(_stats("response_length", length_mask.sum(1)))
    out.update(_stats("prompt_length", exp.prompt_mask.sum(1)))
    if exp.old_log_probs is not None:
        diff = (exp.rollout_log_probs - exp.old_log_probs).abs()
        out["rollout/logprob_diff_mean"] = float(masked_mean(diff, mask))
        out["rollout/logprob_diff_max"] = float(diff[mask.bool()].max()) if mask.any() else 0.0
        out["rollout/logprob_exact_share"] = float(masked_mean((diff == 0).float(), mask))
        if exp.policy_version is not None:  # tokens the iteration's own weights sampled (partial rollout: not all)
            fresh = mask.bool() & (exp.policy_version == version)
            out["rollout/fresh_logprob_diff_max"] = float(diff[fresh].max()) if fresh.any() else 0.0
    if exp.policy_version is not None and mask.any():
        lag = (version - exp.policy_version).float()
        out["rollout/staleness_mean"] = float(masked_mean(lag, mask))
        out["rollout/staleness_max"] = float(lag[mask.bool()].max())
        versions = exp.policy_version[mask.bool()]
        # versions that sampled the batch's tokens, newest minus oldest (in-flight updates mix them within answers)
        out["rollout/version_spread"] = float(versions.max() - versions.min())
        per_row = [row[m.bool()] for row, m in zip(exp.policy_version, mask)]
        mixed = [len(set(r.tolist())) > 1 for r in per_row if len(r)]
        out["rollout/mixed_version_share"] = sum(mixed) / max(1, len(mixed))
    return out


def throughput(metrics: Dict[str, float], responses: int, world_size: int) -> Dict[str, float]:
    """e2e_tps = (response_length_mean + prompt_length_mean) x responses / world_size / timing/all, the
    responses being the iteration's trained samples (gbs x n); update_tps and vllm_tps the same over
    timing/update and timing/rollout."""
    tokens = (metrics["response_length/mean"] + metrics["prompt_length/mean"]) * responses
    per_device = tokens / world_size
    out = {}
    for name, timing in (("e2e_tps", "timing/all"), ("update_tps", "timing/update"), ("vllm_tps", "timing/rollout")):
        seconds = metrics.get(timing, 0.0)
        out[name] = per_device / seconds if seconds > 0 else 0.0
    return out


def timeline_spans(clock: Clock, disaggregated: bool) -> List[Tuple[str, str, float, float]]:
    """(lane, phase, start, end) of an iteration's timed phases, for the run report's timeline."""
    return [(lane, phase, start, end) for phase, start, end in clock.spans for lane in lanes(phase, disaggregated)]


def lanes(phase: str, disaggregated: bool) -> Tuple[str, ...]:
    """Which workers a timed phase occupies (``disaggregated``: generation on rollout workers of their own)."""
    generation = "rollout workers" if disaggregated else "actor"
    if phase in ("timing/rollout", "timing/validation"):
        return (generation,)
    if phase in ("timing/tool", "timing/tool_wait", "timing/rollout_wait"):
        return ("driver",)
    if phase == "timing/weight_sync":
        return ("actor",) if generation == "actor" else ("actor", generation)
    return {
        "timing/all": (),
        "timing/rule_reward": ("reward",),
        "timing/reward_model": ("reward",),
        "timing/judge": ("judge",),
        "timing/judge_wait": ("driver",),
        "timing/reference_model": ("reference",),
        "timing/teacher": ("teacher",),
        "timing/critic_model": ("critic",),
        "timing/update_critic": ("critic",),
        "timing/adv": ("driver",),
    }.get(phase, ("actor",))
