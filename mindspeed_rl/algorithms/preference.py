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
