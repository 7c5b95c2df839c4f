"""Supervised fine-tuning: the negative log-likelihood of the trained tokens (the assistant turns).

Shapes: [B, S] per token; ``log_probs[b, t]`` = log p(x_{b,t} | x_{b,<t}) (position 0 holds 0), ``loss_mask`` 1 on
the tokens that train.
"""

from __future__ import annotations

import torch


def sft_nll_sum(log_probs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """The summed negative log-likelihood of the trained tokens:

    NLL = -sum_{b,t} m_{b,t} log p(x_{b,t} | x_{b,<t})
    """
    return -(log_probs.float() * loss_mask.float()).sum()


def sft_loss(log_probs: torch.Tensor, loss_mask: torch.Tensor, tokens_in_step: int) -> torch.Tensor:
    """One micro-batch's share of the step's token-mean loss:

    L = NLL / N,   N = the trained tokens of the whole optimizer step (every micro-batch, every DP rank)

    so the gradient is that of the step's mean whatever the split into micro-batches and ranks.
    """
    return sft_nll_sum(log_probs, loss_mask) / max(1, tokens_in_step)


def perplexity(nll_sum: float, tokens: int) -> float:
    """exp(NLL / N): the perplexity of the trained tokens (inf for a loss too large to exponentiate)."""
    mean = nll_sum / max(1, tokens)
    return float(torch.tensor(mean).exp()) if mean < 700 else float("inf")
