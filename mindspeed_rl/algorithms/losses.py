"""Policy and value losses, and the loss aggregation modes.

A mini-batch is split into micro-batches (and data-parallel ranks). Each micro-batch returns its
share of the mini-batch's loss, computed with the mini-batch's global counts (``LossScale``): the
shares add up to the same number however the mini-batch is split. Masked positions are selected
away (``torch.where``), never multiplied by 0, so NaN or Inf there cannot leak into a loss or a
gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

from ..config_cls.algorithm_choice import PolicyLoss

Metrics = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class LossScale:
    """Counts of one whole mini-batch (all micro-batches and DP ranks).

    tokens: valid response tokens; sequences: responses with at least one valid token;
    horizon: the fixed length of ``seq-mean-token-sum-norm`` (the most new tokens of a response).
    """

    tokens: float
    sequences: float
    horizon: float = 1.0

    @staticmethod
    def of(mask: torch.Tensor, horizon: Optional[float] = None) -> "LossScale":
        """The counts of ``mask`` alone (a mini-batch that is not split)."""
        m = mask.bool()
        return LossScale(float(m.sum()), float(m.any(1).sum()), float(horizon or mask.shape[1]))


def _select(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), values, torch.zeros_like(values))


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", scale: Optional[LossScale] = None
) -> torch.Tensor:
    """Reduce per-token values l_{i,t} over the valid positions (m = 1) of a mini-batch.

        token-mean:              sum_{i,t} m l / N_tokens
        seq-mean-token-sum:      sum_i (sum_t m l) / N_seqs
        seq-mean-token-mean:     sum_i (sum_t m l / |o_i|) / N_seqs
        seq-mean-token-sum-norm: sum_{i,t} m l / (N_seqs * H)          (Dr. GRPO; H = horizon)
    N_tokens, N_seqs and H come from ``scale`` (the whole mini-batch) or, without it, from ``mask``.
    A mini-batch without valid tokens gives 0.
    """
    scale = scale or LossScale.of(mask)
    picked = _select(values, mask)
    tokens, sequences = max(scale.tokens, 1.0), max(scale.sequences, 1.0)
    if mode == "token-mean":
        return picked.sum() / tokens
    if mode == "seq-mean-token-sum":
        return picked.sum() / sequences
    if mode == "seq-mean-token-mean":
        lengths = mask.bool().sum(1).clamp(min=1).to(picked.dtype)
        return (picked.sum(1) / lengths).sum() / sequences
    if mode == "seq-mean-token-sum-norm":
        return picked.sum() / (sequences * max(scale.horizon, 1.0))
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


def aggregate_token_mean(values: torch.Tensor, mask: torch.Tensor, normaliser: Optional[float] = None) -> torch.Tensor:
    """sum_t(values_t * m_t) / N, N = normaliser (global valid tokens) or this batch's sum(m)."""
    n = float(mask.bool().sum()) if normaliser is None else normaliser
    return aggregate(values, mask, "token-mean", LossScale(n, 1.0))


@dataclass(frozen=True)
class Clip:
    """How the importance ratio is bounded: the clip range [1 - low, 1 + high] (GMPO: [-low, high] in log
    space), the optional dual-clip bound c for A < 0, and SAPO's gate temperatures for A > 0 and A <= 0."""

    low: float = 0.2
    high: float = 0.2
    dual: Optional[float] = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip: Clip) -> Tuple[torch.Tensor, ...]:
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip.low, 1.0 + clip.high)
    loss = torch.maximum(unclipped, clipped)
    clipped_frac = (clipped > unclipped).float()
    lower_frac = torch.zeros_like(loss)
    if clip.dual is not None:
        dual = torch.minimum(loss, -advantages * clip.dual)
        lower_frac = ((advantages < 0) & (loss > -advantages * clip.dual)).float()
        loss = torch.where(advantages < 0, dual, loss)
    return loss, clipped_frac, lower_frac


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_old on valid tokens (0 elsewhere), clamped to [-20, 20] against overflow in exp."""
    return _select(log_prob - old_log_prob, m).clamp(-20.0, 20.0)


def _outside_band(ratio: torch.Tensor, clip: Clip) -> Dict[str, torch.Tensor]:
    """pg_clipfrac / pg_clipfrac_lower shares of a loss without a hard clip: the ratio outside
    [1 - eps_low, 1 + eps_high] / below 1 - eps_low."""
    low = ratio < 1.0 - clip.low
    return {"pg_clipfrac": low | (ratio > 1.0 + clip.high), "pg_clipfrac_lower": low}


def _ratio_metrics(log_ratio: torch.Tensor, m: torch.Tensor, scale: Optional[LossScale], **shares) -> Metrics:
    """ppo_kl = mean(log pi_old - log pi) and each named 0/1 share, as token means over the mini-batch."""
    tokens = LossScale((scale or LossScale.of(m)).tokens, 1.0)
    metrics = {name: aggregate(share.float(), m, "token-mean", tokens).detach() for name, share in shares.items()}
    metrics["ppo_kl"] = aggregate(-log_ratio, m, "token-mean", tokens).detach()
    return metrics


def vanilla_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: Clip,
    mode: str = "token-mean",
    scale: Optional[LossScale] = None,
    weights: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """PPO's clipped surrogate, with clip-higher (DAPO) and the optional dual clip.

        ratio_t = exp(log pi_t - log pi_old_t)
        L_t     = w_t * max(-A_t ratio_t, -A_t clip(ratio_t, 1 - eps_low, 1 + eps_high))
        dual:     for A_t < 0, L_t = min(L_t, -A_t c)
        loss    = aggregate(L, loss_agg_mode)
    w_t: rollout-correction weights (1 when off). Metrics are token means over the mini-batch:
    pg_clipfrac (the clipped term is the larger), pg_clipfrac_lower (the dual clip bound applies),
    ppo_kl = mean(log pi_old - log pi).
    """
    m = mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob, m)
    advantages = _select(advantages, m)
    loss, clipped_frac, lower_frac = _clipped_surrogate(log_ratio.exp(), advantages, clip)
    if weights is not None:
        loss = loss * _select(weights, m)
    metrics = _ratio_metrics(log_ratio, m, scale, pg_clipfrac=clipped_frac, pg_clipfrac_lower=lower_frac)
    return aggregate(loss, m, mode, scale), metrics


def gspo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: Clip,
    mode: str = "seq-mean-token-mean",
    scale: Optional[LossScale] = None,
    weights: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """GSPO: one importance ratio per sequence, the geometric mean of its token ratios.

        s_i     = exp( (1/|o_i|) sum_t (log pi_t - log pi_old_t) )
        s_{i,t} = sg(s_i) * pi_t / sg(pi_t)        (value s_i, gradient through each token)
        L_{i,t} = w_t * max(-A_i s_{i,t}, -A_i clip(s_{i,t}, 1 - eps_low, 1 + eps_high))
        loss    = aggregate(L, loss_agg_mode)     (the GSPO paper: seq-mean-token-mean)
    pg_clipfrac is the share of sequences whose ratio is clipped.
    """
    m = mask.bool()
    log_ratio = _select(log_prob - old_log_prob, m)
    lengths = m.sum(1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
    seq_log_ratio = log_ratio.sum(1, keepdim=True) / lengths
    token_log_ratio = seq_log_ratio.detach() + log_prob - log_prob.detach()
    token_log_ratio = _select(token_log_ratio, m).clamp(-20.0, 20.0)
    advantages = _select(advantages, m)
    loss, clipped_frac, lower_frac = _clipped_surrogate(token_log_ratio.exp(), advantages, clip)
    if weights is not None:
        loss = loss * _select(weights, m)
    scale = scale or LossScale.of(mask)
    seqs = LossScale(scale.tokens, scale.sequences)
    metrics = {
        "pg_clipfrac": aggregate(clipped_frac, m, "seq-mean-token-mean", seqs).detach(),
        "pg_clipfrac_lower": aggregate(lower_frac, m, "seq-mean-token-mean", seqs).detach(),
        "ppo_kl": aggregate(-log_ratio, m, "token-mean", LossScale(scale.tokens, 1.0)).detach(),
    }
    return aggregate(loss, m, mode, scale), metrics


def cispo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: Clip,
    mode: str = "token-mean",
    scale: Optional[LossScale] = None,
    weights: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, arXiv:2506.13585; verl's ``cispo``): the importance weight is clipped and detached,
    so every token keeps a gradient (PPO's clip zeroes it outside the range).

        ratio_t = exp(log pi_t - log pi_old_t)
        r_t     = sg(clip(ratio_t, 1 - eps_low, 1 + eps_high))
        L_t     = -w_t r_t A_t log pi_t             grad L_t = -w_t r_t A_t grad log pi_t
        loss    = aggregate(L, loss_agg_mode)
    pg_clipfrac: the share of tokens whose weight is clipped (pg_clipfrac_lower: those below 1 - eps_low).
    """
    m = mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob, m)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1.0 - clip.low, 1.0 + clip.high).detach()
    loss = -weight * _select(advantages, m) * _select(log_prob, m)
    if weights is not None:
        loss = loss * _select(weights, m)
    return aggregate(loss, m, mode, scale), _ratio_metrics(log_ratio, m, scale, **_outside_band(ratio, clip))


def sapo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: Clip,
    mode: str = "seq-mean-token-mean",
    scale: Optional[LossScale] = None,
    weights: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """SAPO (Qwen, arXiv:2511.20347; verl's ``sapo``): a soft gate of temperature tau in place of the hard
    clip; its slope is 1 on policy (PPO's gradient) and decays smoothly as the ratio moves away.

        ratio_t = exp(log pi_t - log pi_old_t)
        tau_t   = tau_pos if A_t > 0 else tau_neg
        f(r)    = (4 / tau_t) sigmoid(tau_t (r - 1))         f'(1) = 1
        L_t     = -w_t f(ratio_t) A_t
        loss    = aggregate(L, loss_agg_mode)                (published with seq-mean-token-mean)
    pg_clipfrac: the share of tokens whose ratio is outside [1 - eps_low, 1 + eps_high] (gated, not clipped).
    """
    m = mask.bool()
    log_ratio = _log_ratio(log_prob, old_log_prob, m)
    ratio = log_ratio.exp()
    advantages = _select(advantages, m)
    tau = torch.where(advantages > 0, clip.tau_pos, clip.tau_neg).to(ratio.dtype)
    loss = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * advantages
    if weights is not None:
        loss = loss * _select(weights, m)
    return aggregate(loss, m, mode, scale), _ratio_metrics(log_ratio, m, scale, **_outside_band(ratio, clip))


def gmpo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: Clip,
    mode: str = "seq-mean-token-mean",
    scale: Optional[LossScale] = None,
    weights: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """GMPO (arXiv:2507.20673; verl's ``geo_mean``): one ratio per sequence, the geometric mean of its token
    ratios, each clipped in log space first (the bound on the side its advantage pushes towards).

        l_t    = log pi_t - log pi_old_t,   s = sign(A_i)
        l^_t   = s min(s l_t, s clip(l_t, -eps_low, eps_high))      (the paper: eps = 0.4)
        r_i    = exp(mean_t l^_t),   A_i = mean_t A_t,   w_i = exp(mean_t log w_t)
        L_i    = -w_i A_i r_i, on every token of sequence i
        loss   = aggregate(L, loss_agg_mode)      (seq-mean-token-mean: sum_i L_i / N_seqs, as published)
    pg_clipfrac / pg_clipfrac_lower: the share of tokens clipped with A > 0 / A < 0.
    """
    m = mask.bool()
    log_ratio = _select(log_prob - old_log_prob, m)
    advantages = _select(advantages, m)
    sign = torch.sign(advantages)
    bounded = log_ratio.clamp(-clip.low, clip.high)
    clipped = sign * torch.minimum(sign * log_ratio, sign * bounded)
    lengths = m.sum(1).clamp(min=1).to(log_ratio.dtype)
    ratio = (_select(clipped, m).sum(1) / lengths).clamp(max=20.0).exp()
    loss = -(advantages.sum(1) / lengths) * ratio
    if weights is not None:
        loss = loss * (_select(weights.clamp(min=1e-10).log(), m).sum(1) / lengths).exp()
    was_clipped = clipped != log_ratio  # the bound on the side of its advantage binds
    metrics = _ratio_metrics(
        log_ratio,
        m,
        scale,
        pg_clipfrac=was_clipped & (advantages > 0),
        pg_clipfrac_lower=was_clipped & (advantages < 0),
    )
    return aggregate(loss.unsqueeze(1).expand_as(log_ratio), m, mode, scale), metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    mode: str = "token-mean",
    scale: Optional[LossScale] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """Clipped value loss.

    V_clip = V_old + clip(V - V_old, -c, c)
    L_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)
    vf_clipfrac = token share where the clipped error is the larger one
    """
    m = mask.bool()
    values, old_values, returns = _select(values, m), _select(old_values, m), _select(returns, m)
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    err, err_clipped = (values - returns).square(), (clipped - returns).square()
    loss = 0.5 * torch.maximum(err, err_clipped)
    frac = (err_clipped > err).float()
    tokens = LossScale((scale or LossScale.of(mask)).tokens, 1.0)
    return aggregate(loss, m, mode, scale), {"vf_clipfrac": aggregate(frac, m, "token-mean", tokens).detach()}


def entropy_loss(
    entropy: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", scale: Optional[LossScale] = None
) -> torch.Tensor:
    """The mean entropy H_t under ``mode``; the actor loss subtracts entropy_coeff x this."""
    return aggregate(entropy, mask, mode, scale)


def policy_loss(spec: PolicyLoss, *args: Any, **kwargs: Any) -> Tuple[torch.Tensor, Metrics]:
    """The registered policy loss a run chose (``spec.function``), called with the surrogate's arguments."""
    return globals()[spec.function](*args, **kwargs)
