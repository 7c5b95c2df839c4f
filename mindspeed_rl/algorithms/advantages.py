"""Token rewards, GAE, returns, whitening, group-normalised advantages."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """mean(x) over entries where mask = 1:  sum(x * m) / sum(m)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over masked entries: sum(m (x - mean)^2) / (n - 1)  (or / n when not unbiased)."""
    mean = masked_mean(x, mask)
    n = mask.to(x.dtype).sum()
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked entries (the mean added back if not shift_mean)."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


def token_level_rewards(scores: torch.Tensor, mask: torch.Tensor, kl: Optional[torch.Tensor] = None,
                        kl_coef: float = 0.0) -> torch.Tensor:
    """r_t = -beta * KL_t on every response token, plus the sequence score on the last one.

        r_t = score * [t = last valid token] - beta * kl_t     (kl term only when use_kl_in_reward)
    """
    mask = mask.to(scores.dtype)
    last = (mask * torch.arange(mask.shape[1], device=mask.device)).argmax(dim=1)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(mask.shape[0]), last] = scores.to(mask.dtype)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl * mask
    return rewards * mask


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                lam: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the valid response tokens.

        delta_t = r_t + gamma * V_{t+1} - V_t          (V after the last valid token is 0)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                           (the value target)
    Padded positions get A = R = 0 and do not carry the recursion.
    """
    mask = mask.to(values.dtype)
    values = values * mask
    advantages = torch.zeros_like(values)
    last_gae = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    next_value = torch.zeros_like(last_gae)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        last_gae = torch.where(m.bool(), gae, last_gae)
        next_value = torch.where(m.bool(), values[:, t], next_value)
        advantages[:, t] = gae * m
    returns = (advantages + values) * mask
    return advantages, returns


def group_norm_advantages(scores: torch.Tensor, mask: torch.Tensor, group_ids: Sequence[int],
                          eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor]:
    """GRPO-style outcome advantages: each response's score normalised within its prompt's group.

        A_i = (s_i - mean_{j in g(i)} s_j) / (std_{j in g(i)} s_j + eps), broadcast to every token
    """
    ids = torch.as_tensor(list(group_ids), device=scores.device)
    adv = torch.zeros_like(scores, dtype=torch.float32)
    for g in ids.unique():
        sel = ids == g
        s = scores[sel].float()
        std = s.std() if s.numel() > 1 else torch.tensor(0.0, device=s.device)
        adv[sel] = (s - s.mean()) / (std + eps)
    out = adv.unsqueeze(1) * mask.float()
    return out, out
