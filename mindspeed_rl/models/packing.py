"""Computing on valid tokens only: packed micro-batches, token-budget micro-batches, DP length balance.

Rows arrive padded ([B, S]: left-padded prompt, right-padded response). Two ways to skip the padding in the
model call, both exact (the model's outputs on valid tokens are unchanged, then scattered back to [B, S], so
losses and log-probs are computed on the same tensors as the padded path):

- ``pack``: the valid tokens of all rows of a micro-batch as one sequence [1, T] in megatron's "thd" packed
  format: ``cu_seqlens`` marks where each row starts and attention stays causal inside each row
  (models/attention.py; Transformer Engine's attention on CUDA), so no token sees another row and no
  padding is computed (``rl_config.use_remove_padding``).
- ``trim``: the rows kept as rows, minus the columns that are padding in every row of the micro-batch
  (token-budget micro-batches without packing).

``megatron_attention_mask`` and ``position_ids_from_mask`` build the padded path's inputs (used by ``trim``,
the engine and the fallback rollout). ``token_budget_groups`` forms micro-batches of at most a token budget
(``use_dynamic_bsz``) and
``balanced_split`` hands DP ranks equal row counts with near-equal token sums (``use_dp_batch_balance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch


@dataclass
class ModelInput:
    """What the GPT model is called with, and how to put its output back on the padded [B, S] grid."""

    input_ids: torch.Tensor  # [b, s]
    position_ids: torch.Tensor  # [b, s]
    attention_mask: Optional[torch.Tensor]  # [b, 1, s, s] bool, True where masked (megatron's); None when packed
    rows: torch.Tensor  # for each computed position with a real token: its row in [B, S] ...
    cols: torch.Tensor  # ... and its column
    flat: torch.Tensor  # ... and its index in the computed output, flattened over (b, s)
    shape: Tuple[int, int]  # (B, S)
    cu_seqlens: Optional[torch.Tensor] = None  # packed: [rows + 1] starts of the rows in the sequence
    max_seqlen: int = 0

    def run(self, model) -> torch.Tensor:
        """The model's output on the padded [B, S] grid."""
        if self.cu_seqlens is None:
            return self.restore(model(self.input_ids, self.position_ids, self.attention_mask))
        from .attention import packed_seq_params

        return self.restore(
            model(
                self.input_ids,
                self.position_ids,
                None,
                packed_seq_params=packed_seq_params(self.cu_seqlens, self.max_seqlen),
            )
        )

    def restore(self, output: torch.Tensor) -> torch.Tensor:
        """The model's output [b, s, *] back on [B, S, *]; positions without a real token get 0."""
        flat = output.reshape(-1, *output.shape[2:])
        full = output.new_zeros(self.shape + tuple(output.shape[2:]))
        return full.index_put((self.rows, self.cols), flat[self.flat])


def megatron_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] (1 = real token) -> megatron's [B, 1, S, S] boolean mask, True where masked.

    A query may attend to earlier real keys only (causal and key padding); padded query rows
    attend to themselves so softmax stays finite.
    """
    s = attention_mask.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril()
    keep = causal[None] & attention_mask.bool()[:, None, :]
    keep = keep | torch.eye(s, dtype=torch.bool, device=attention_mask.device)[None]
    return (~keep).unsqueeze(1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions count real tokens only, so left padding does not shift RoPE."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, multiple: int = 1, pad_id: int = 0) -> ModelInput:
    """Valid tokens of every row, in order, as one sequence (length rounded up to ``multiple`` for sequence
    parallelism; the filler tokens form a segment of their own and are dropped by ``restore``)."""
    mask = attention_mask.bool()
    rows, cols = mask.nonzero(as_tuple=True)
    total = int(rows.numel())
    length = max(1, -(-total // multiple) * multiple)
    device = input_ids.device
    ids = torch.full((1, length), pad_id, dtype=input_ids.dtype, device=device)
    ids[0, :total] = input_ids[rows, cols]
    positions = torch.zeros(1, length, dtype=torch.long, device=device)
    positions[0, :total] = position_ids_from_mask(attention_mask)[rows, cols]
    lengths = mask.sum(1)
    bounds = [0] + torch.cumsum(lengths[lengths > 0], 0).tolist()
    if length > total:
        bounds.append(length)
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    return ModelInput(
        ids,
        positions,
        None,
        rows,
        cols,
        torch.arange(total, device=device),
        tuple(attention_mask.shape),
        cu,
        int((cu[1:] - cu[:-1]).max()),
    )


def trim(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelInput:
    """The rows without the columns that are padding in all of them."""
    valid_cols = attention_mask.bool().any(0).nonzero().flatten()
    lo, hi = (int(valid_cols[0]), int(valid_cols[-1]) + 1) if valid_cols.numel() else (0, 1)
    mask = attention_mask[:, lo:hi]
    b, s = mask.shape
    rows = torch.arange(b, device=mask.device).repeat_interleave(s)
    cols = torch.arange(lo, hi, device=mask.device).repeat(b)
    return ModelInput(
        input_ids[:, lo:hi],
        position_ids_from_mask(mask),
        megatron_attention_mask(mask),
        rows,
        cols,
        torch.arange(b * s, device=mask.device),
        tuple(attention_mask.shape),
    )


def token_budget_groups(lengths: Sequence[int], budget: int, packed: bool) -> List[np.ndarray]:
    """Row indices of micro-batches whose cost fits ``budget`` tokens: the sum of valid lengths when packed,
    rows x the longest row otherwise. Rows are taken longest first (first-fit decreasing), so each
    micro-batch holds rows of similar length. A row longer than the budget gets a micro-batch of its own."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    groups: List[List[int]] = []
    costs: List[Tuple[int, int]] = []  # (sum of lengths, (rows, longest)) per group
    for row in order.tolist():
        n = int(lengths[row])
        for g, (total, rows_longest) in enumerate(costs):
            rows, longest = rows_longest
            cost = total + n if packed else (rows + 1) * max(longest, n)
            if cost <= budget:
                groups[g].append(row)
                costs[g] = (total + n, (rows + 1, max(longest, n)))
                break
        else:
            groups.append([row])
            costs.append((n, (1, n)))
    return [np.asarray(g, dtype=np.int64) for g in groups]


def restore_order(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Rows computed in ``order`` (row indices) put back in the original row order."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return values[inverse.to(values.device)]


def balanced_split(lengths: Sequence[int], parts: int) -> List[np.ndarray]:
    """``parts`` shares of equal row count (as np.array_split gives) with near-equal token sums: rows
    longest first, each to the share with the fewest tokens that still has room. Each share sorted."""
    sizes = [len(a) for a in np.array_split(np.arange(len(lengths)), parts)]
    shares: List[List[int]] = [[] for _ in range(parts)]
    tokens = [0] * parts
    for row in np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist():
        open_shares = [p for p in range(parts) if len(shares[p]) < sizes[p]]
        target = min(open_shares, key=lambda p: (tokens[p], p))
        shares[target].append(row)
        tokens[target] += int(lengths[row])
    return [np.asarray(sorted(s), dtype=np.int64) for s in shares]
