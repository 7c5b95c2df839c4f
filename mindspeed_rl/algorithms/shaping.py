"""Reward shaping and group filtering of DAPO."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the score of a response of |o| tokens:

        0                                      if |o| <= L_max - L_buf
        (L_max - L_buf - |o|) / L_buf * factor if L_max - L_buf < |o| <= L_max      (from 0 down to -factor)
        -factor                                if |o| > L_max
    L_max = max_tokens, L_buf = buffer.
    """
    expected = max_tokens - buffer
    penalty = (expected - lengths.float()) / max(buffer, 1) * factor
    return penalty.clamp(min=-factor, max=0.0)


def informative_groups(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic-sampling filter: a bool per row, true when the row's group has values that are
    not all equal (a group whose responses all score alike has zero group-relative advantage).

        keep_i = max_{j in g(i)} v_j > min_{j in g(i)} v_j
    """
    ids, inverse = torch.unique(group.to(values.device), return_inverse=True)
    x = values.float()
    high = x.new_full((len(ids),), -float("inf")).scatter_reduce(0, inverse, x, "amax")
    low = x.new_full((len(ids),), float("inf")).scatter_reduce(0, inverse, x, "amin")
    return (high > low)[inverse]
