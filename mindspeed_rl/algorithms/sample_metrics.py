"""Metrics of n sampled answers per problem: pass@k (unbiased) and maj@k, shared by evaluation and validation.

Rows are problems, columns their n samples in the order drawn.
"""

from __future__ import annotations

import torch


def pass_at_k(correct: torch.Tensor, k: int) -> torch.Tensor:
    """The probability that k of a problem's n samples, drawn without replacement, hold a correct one, per problem
    (Chen et al. 2021's unbiased estimator; c = correct samples of the n):

        pass@k = 1 - C(n - c, k) / C(n, k)  =  1 - prod_{i = n - c + 1}^{n} (1 - k / i)

    ``correct``: bool [problems, n]; k <= n."""
    n = correct.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    c = correct.sum(1).to(torch.float64)
    i = torch.arange(1, n + 1, dtype=torch.float64)  # the product's factors (1 - k / i) for i > n - c
    factors = torch.where(i > n - c[:, None], 1.0 - k / i, torch.ones_like(i))
    return 1.0 - factors.prod(1)


def maj_at_k(answers: torch.Tensor, correct: torch.Tensor, k: int) -> torch.Tensor:
    """Whether the most frequent answer among a problem's first k samples is a correct one (ties: the answer drawn
    first), per problem:

        maj@k = correct[argmax_a count(a in answers[:k])]

    ``answers``: long [problems, n], equal ids for equal answers (-1: none extracted, never a majority unless all
    are none); ``correct``: bool [problems, n]."""
    n = answers.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k}, n={n}")
    first = answers[:, :k]
    counts = (first[:, :, None] == first[:, None, :]).sum(2)  # how often each sample's answer occurs in the k
    counts = torch.where(first >= 0, counts, torch.zeros_like(counts))
    winner = counts.argmax(1)  # the first sample with the top count
    return correct[:, :k].gather(1, winner[:, None]).squeeze(1)
