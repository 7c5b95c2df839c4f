"""Outcome reward models from preference pairs (Bradley-Terry): a scalar head r(x, y) read at the last token of
prompt + answer, trained so that the preferred answer scores higher.

Shapes: [N] per pair; ``chosen`` and ``rejected`` are the rewards of the two answers of the same prompt.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Negative log-likelihood of the preferences under the Bradley-Terry model, per pair:

        P(y_c > y_r | x) = sigmoid(r(x, y_c) - r(x, y_r) - m)
        loss_i = -log sigmoid(r_c,i - r_r,i - m_i)      (softplus(-(r_c - r_r - m)), stable for large gaps)

    ``margin`` m (optional, per pair): how much higher the chosen answer must score (Llama 2's margin loss)."""
    gap = chosen.float() - rejected.float()
    if margin is not None:
        gap = gap - margin.float()
    return F.softplus(-gap)


def preference_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> Dict[str, float]:
    """Per batch of pairs:

    accuracy     = mean_i 1[r_c,i > r_r,i]   (a tie counts as wrong)
    margin_mean  = mean_i (r_c,i - r_r,i)
    chosen_mean  = mean_i r_c,i,   rejected_mean = mean_i r_r,i"""
    chosen, rejected = chosen.float(), rejected.float()
    return {
        "accuracy": float((chosen > rejected).float().mean()),
        "margin_mean": float((chosen - rejected).mean()),
        "chosen_mean": float(chosen.mean()),
        "rejected_mean": float(rejected.mean()),
    }


def log_ratio_gap(
    policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor
) -> torch.Tensor:
    """How much more the policy than the reference prefers the chosen answer, per pair:

    h_i = (log pi(y_c|x) - log ref(y_c|x)) - (log pi(y_r|x) - log ref(y_r|x))"""
    return (policy_chosen.float() - ref_chosen.float()) - (policy_rejected.float() - ref_rejected.float())


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Direct preference optimisation (Rafailov et al. 2023), per pair, with conservative label smoothing e
    (Mitchell 2023: the preference label is wrong with probability e):

        loss_i = -(1 - e) log sigmoid(beta h_i) - e log sigmoid(-beta h_i)      (h_i: ``log_ratio_gap``)

    Arguments are summed log-probabilities of each answer's tokens given the prompt."""
    h = log_ratio_gap(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    return (1 - label_smoothing) * F.softplus(-beta * h) + label_smoothing * F.softplus(beta * h)


def ipo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    chosen_tokens: Optional[torch.Tensor] = None,
    rejected_tokens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Identity preference optimisation (Azar et al. 2023, eq. 17), per pair: the log-ratio gap regressed to
    1 / (2 beta) instead of pushed without bound. With the answers' token counts |y_c|, |y_r| each answer's log-ratio
    is averaged over its tokens (the paper's average log-likelihoods, TRL's ``loss_type="ipo"``):

        h_i = (log pi(y_c|x) - log ref(y_c|x)) / |y_c| - (log pi(y_r|x) - log ref(y_r|x)) / |y_r|
        loss_i = (h_i - 1 / (2 beta))^2

    without them h_i is ``log_ratio_gap`` of the summed log-probabilities."""
    chosen = policy_chosen.float() - ref_chosen.float()
    rejected = policy_rejected.float() - ref_rejected.float()
    if chosen_tokens is not None and rejected_tokens is not None:
        chosen, rejected = chosen / chosen_tokens.float(), rejected / rejected_tokens.float()
    elif chosen_tokens is not None or rejected_tokens is not None:
        raise ValueError("ipo_loss: give the token counts of both answers or of neither")
    return (chosen - rejected - 1.0 / (2.0 * beta)) ** 2


def simpo_loss(
    policy_chosen_mean: torch.Tensor, policy_rejected_mean: torch.Tensor, beta: float, gamma: float
) -> torch.Tensor:
    """SimPO (Meng et al. 2024), per pair, reference-free: the length-normalised log-likelihood is the implicit
    reward, and the chosen answer must win by a margin gamma,

        loss_i = -log sigmoid(beta (mean_t log pi(y_c,t) - mean_t log pi(y_r,t)) - gamma)

    Arguments are per-token mean log-probabilities of each answer."""
    return F.softplus(-(beta * (policy_chosen_mean.float() - policy_rejected_mean.float()) - gamma))


def dpo_metrics(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: Optional[torch.Tensor],
    ref_rejected: Optional[torch.Tensor],
    beta: float,
) -> Dict[str, torch.Tensor]:
    """Per-pair sums behind TRL's preference metrics (divide by the pairs for the means); the implicit rewards are
    beta times the log-ratio to the reference, or beta times the policy's own figure without one (SimPO passes
    mean log-probs):

        rewards/chosen = beta (log pi(y_c|x) - log ref(y_c|x)),  rewards/rejected likewise
        rewards/accuracies = 1[reward_c > reward_r],  rewards/margins = reward_c - reward_r
        logps/chosen, logps/rejected = the policy's figures"""
    reward_c = beta * (chosen.float() - (ref_chosen.float() if ref_chosen is not None else 0.0))
    reward_r = beta * (rejected.float() - (ref_rejected.float() if ref_rejected is not None else 0.0))
    return {
        "rewards/chosen": reward_c.sum(),
        "rewards/rejected": reward_r.sum(),
        "rewards/accuracies": (reward_c > reward_r).float().sum(),
        "rewards/margins": (reward_c - reward_r).sum(),
        "logps/chosen": chosen.float().sum(),
        "logps/rejected": rejected.float().sum(),
    }
