"""PPO losses with token-mean aggregation over a global normaliser.

A mini-batch is split into micro-batches (and data-parallel ranks); each micro-batch returns its
share sum(loss_t * m_t) / N, N being the number of valid tokens in the whole mini-batch, so
the shares add up to the exact token mean however the mini-batch is split.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch


def aggregate_token_mean(values: torch.Tensor, mask: torch.Tensor, normaliser: Optional[float] = None) -> torch.Tensor:
    """sum_t(values_t * m_t) / N, N = normaliser (global valid tokens) or this batch's sum(m)."""
    mask = mask.to(values.dtype)
    n = mask.sum().clamp(min=1) if normaliser is None else normaliser
    return (values * mask).sum() / n


def policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_ratio: float, clip_ratio_c: Optional[float] = None,
                normaliser: Optional[float] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """PPO clipped surrogate (with the optional dual clip for negative advantages).

        ratio_t = exp(log pi - log pi_old)
        L_t     = max(-A_t ratio_t, -A_t clip(ratio_t, 1 - eps, 1 + eps))
        dual:     for A_t < 0, L_t = min(L_t, -A_t c)
        pg_clipfrac = share of tokens where the clipped term is the larger one
        ppo_kl      = mean(log pi_old - log pi)
    """
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    loss = torch.maximum(unclipped, clipped)
    clipped_frac = (clipped > unclipped).float()
    if clip_ratio_c is not None:
        dual = torch.minimum(loss, -advantages * clip_ratio_c)
        loss = torch.where(advantages < 0, dual, loss)
    metrics = {"pg_clipfrac": aggregate_token_mean(clipped_frac, mask, normaliser).detach(),
               "ppo_kl": aggregate_token_mean(-log_ratio, mask, normaliser).detach()}
    return aggregate_token_mean(loss, mask, normaliser), metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               cliprange_value: float, normaliser: Optional[float] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Clipped value loss.

        V_clip = V_old + clip(V - V_old, -c, c)
        L_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)
        vf_clipfrac = share of tokens where the clipped error is the larger one
    """
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    err, err_clipped = (values - returns).square(), (clipped - returns).square()
    loss = 0.5 * torch.maximum(err, err_clipped)
    frac = (err_clipped > err).float()
    return aggregate_token_mean(loss, mask, normaliser), {
        "vf_clipfrac": aggregate_token_mean(frac, mask, normaliser).detach()}


def entropy_loss(entropy: torch.Tensor, mask: torch.Tensor, normaliser: Optional[float] = None) -> torch.Tensor:
    """Token-mean entropy H_t; the actor loss subtracts entropy_coeff x this."""
    return aggregate_token_mean(entropy, mask, normaliser)
