"""Token rewards and the advantage estimators.

Shapes: [B, R] over response tokens, ``mask`` 1 on real response tokens; ``group`` [B] holds the
index of each response's prompt (the n responses of one prompt share it). Every estimator returns
``(advantages, returns)``, both [B, R] and 0 on padding; ``returns`` is the critic's target for GAE
and equals the advantages (or the reward-to-go) elsewhere. The registry (``config_cls/algorithm_choice.py``)
maps config names to these functions and :func:`estimate` calls the one a run chose; a parameter's name says
which input it reads.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional, Sequence, Tuple

import torch

from ..config_cls.algorithm_choice import AdvantageEstimator

Pair = Tuple[torch.Tensor, torch.Tensor]


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """mean(x) over entries where mask = 1:  sum(x * m) / sum(m), masked entries never read."""
    mask = mask.bool()
    x = torch.where(mask, x, torch.zeros_like(x))
    count = mask.to(x.dtype)
    if dim is None:
        return x.sum() / count.sum().clamp(min=1)
    return x.sum(dim) / count.sum(dim).clamp(min=1)


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
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def token_level_rewards(
    scores: torch.Tensor, mask: torch.Tensor, kl: Optional[torch.Tensor] = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """r_t = -beta * KL_t on every response token, plus the sequence score on the last one.

    r_t = score * [t = last valid token] - beta * kl_t     (kl term only when use_kl_in_reward)
    """
    mask = mask.to(scores.dtype)
    last = (mask * torch.arange(mask.shape[1], device=mask.device)).argmax(dim=1)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(mask.shape[0], device=mask.device), last] = scores.to(mask.dtype)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * torch.where(mask.bool(), kl, torch.zeros_like(kl))
    return rewards * mask


def sequence_rewards(
    token_rewards: torch.Tensor, mask: torch.Tensor, scores: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """R_i = sum_t r_{i,t}: the score, minus beta * sum_t KL_t when the KL is in the reward.

        R_i = score_i  for a response with no valid token (given ``scores``)

    An empty response has no token to carry its score; as in verl it still counts with its score in the
    group statistics (DAPO's -1 for an empty answer stays -1, not 0).
    """
    summed = torch.where(mask.bool(), token_rewards, torch.zeros_like(token_rewards)).sum(1)
    if scores is None:
        return summed
    empty = ~mask.bool().any(1)
    return torch.where(empty, scores.to(summed.dtype), summed)


def _broadcast(per_sequence: torch.Tensor, mask: torch.Tensor) -> Pair:
    out = per_sequence.float().unsqueeze(1) * mask.float()
    return out, out


def _group_stats(x: torch.Tensor, group: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: the mean, the unbiased std and the size of its group."""
    ids, inverse = torch.unique(group.to(x.device), return_inverse=True)
    size = x.new_zeros(len(ids)).index_add_(0, inverse, torch.ones_like(x))
    mean = x.new_zeros(len(ids)).index_add_(0, inverse, x) / size
    sq = x.new_zeros(len(ids)).index_add_(0, inverse, (x - mean[inverse]) ** 2)
    std = torch.where(size > 1, (sq / (size - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return mean[inverse], std[inverse], size[inverse]


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> Pair:
    """Generalised advantage estimation over the valid response tokens.

        delta_t = r_t + gamma * V_{t+1} - V_t          (V after the last valid token is 0)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                           (the value target)
    t + 1 is the next token with mask 1: masked positions (padding, tool results inside a multi-turn
    trajectory) get A = R = 0 and are skipped by the recursion, neither discounting nor breaking it.
    """
    mask = mask.to(values.dtype)
    values = torch.where(mask.bool(), values, torch.zeros_like(values))
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


def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float, whiten: bool
) -> Pair:
    """PPO's estimator: GAE(gamma, lambda) on the critic's values; A whitened over the batch's valid
    tokens when ``whiten`` (R_t = A_t + V_t is taken before whitening)."""
    adv, returns = compute_gae(token_rewards, values, mask, gamma, lam)
    return (masked_whiten(adv, mask) if whiten else adv), returns


def group_norm_advantages(
    scores: torch.Tensor, mask: torch.Tensor, group_ids: Sequence[int], eps: float = 1e-6
) -> Pair:
    """GRPO: each response's reward normalised within its prompt's group, broadcast to every token.

    A_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps)
    """
    group = torch.as_tensor(list(group_ids), device=scores.device)
    mean, std, _ = _group_stats(scores.float(), group)
    return _broadcast((scores.float() - mean) / (std + eps), mask)


def grpo_advantages(sequence_rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> Pair:
    """GRPO (MindSpeed-RL's ``group_norm``):  A_i = (R_i - mean_g R) / (std_g R + 1e-6)."""
    return group_norm_advantages(sequence_rewards, mask, group.tolist())


def dr_grpo_advantages(sequence_rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> Pair:
    """Dr. GRPO: the group mean is the baseline, no division by the group std.

    A_i = R_i - mean_{j in g(i)} R_j
    """
    mean, _, _ = _group_stats(sequence_rewards.float(), group)
    return _broadcast(sequence_rewards.float() - mean, mask)


def rloo_advantages(sequence_rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> Pair:
    """RLOO: the baseline of a response is the mean of the other responses of its prompt.

    A_i = R_i - 1/(n-1) sum_{j in g(i), j != i} R_j  =  n/(n-1) (R_i - mean_g R)
    """
    r = sequence_rewards.float()
    mean, _, size = _group_stats(r, group)
    others = (mean * size - r) / (size - 1).clamp(min=1)
    return _broadcast(torch.where(size > 1, r - others, torch.zeros_like(r)), mask)


def reinforce_plus_plus_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> Pair:
    """REINFORCE++: the discounted reward-to-go over the policy's own tokens, whitened over the batch.

        G_t = sum_{k >= t, m_k = 1} gamma^(n(t, k)) r_k,   n(t, k) = #{j : t <= j < k, m_j = 1}
        A_t = (G_t - mean G) / std G;   returns = G
    Masked tokens (tool results inside a multi-turn trajectory, padding) neither discount nor break the sum:
    the return carries across them unchanged, as if they were not there.
    """
    m = mask.bool()
    rewards = torch.where(m, token_rewards.float(), torch.zeros_like(token_rewards, dtype=torch.float32))
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(m[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    returns = torch.where(m, returns, torch.zeros_like(returns))
    return masked_whiten(returns, mask), returns


def reinforce_plus_plus_baseline_advantages(
    sequence_rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor
) -> Pair:
    """REINFORCE++ with a group baseline: subtract the prompt's mean reward, then whiten over the batch.

    a_i = R_i - mean_{j in g(i)} R_j;   A_{i,t} = whiten(a_i broadcast to tokens)
    """
    mean, _, _ = _group_stats(sequence_rewards.float(), group)
    centred, _ = _broadcast(sequence_rewards.float() - mean, mask)
    adv = masked_whiten(centred, mask)
    return adv, adv


def estimate(estimator: AdvantageEstimator, **inputs: Any) -> Pair:
    """(advantages, returns) of a registered estimator: its function called with the named inputs it asks for."""
    fn = globals()[estimator.function]
    return fn(**{name: inputs[name] for name in inspect.signature(fn).parameters})
