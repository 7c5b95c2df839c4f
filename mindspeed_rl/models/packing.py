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

import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch


@dataclass
class ModelInput:
    """What the GPT model is called with (the "computed layout" [b, s]), and how its per-position outputs go
    back on the padded [B, S] grid. With context parallelism the model sees this rank's positions only
    (``split_context_parallel``); ``gather`` puts per-position values of all CP ranks back together."""

    input_ids: torch.Tensor  # [b, s] (with CP: [b, s / CP], this rank's positions)
    position_ids: torch.Tensor  # [b, s]
    attention_mask: Optional[torch.Tensor]  # [b, 1, s, s] bool, True where masked (megatron's); None when packed
    rows: torch.Tensor  # for each computed position with a real token: its row in [B, S] ...
    cols: torch.Tensor  # ... and its column
    flat: torch.Tensor  # ... and its index in the computed layout, flattened over (b, s)
    shape: Tuple[int, int]  # (B, S)
    cu_seqlens: Optional[torch.Tensor] = None  # packed: [segments + 1] starts of the segments in the sequence
    max_seqlen: int = 0
    labels: Optional[torch.Tensor] = None  # [b, s]: the next token of the same row (0 where there is none)
    has_next: Optional[torch.Tensor] = None  # for each real token: whether the next one in its row is real
    length: int = 0  # s of the whole computed layout (with CP: before the split)
    cp_index: Optional[torch.Tensor] = None  # [CP, s / CP]: the positions each CP rank holds
    extras: Optional[Dict[str, torch.Tensor]] = None  # more model inputs (a vision model's pixel values and grids)

    def run(self, model) -> torch.Tensor:
        """The model's output in the computed layout ([b, s, *]; with CP this rank's [b, s / CP, *])."""
        if self.cu_seqlens is None:
            return model(self.input_ids, self.position_ids, self.attention_mask, **(self.extras or {}))
        from .attention import packed_seq_params

        return model(
            self.input_ids,
            self.position_ids,
            None,
            packed_seq_params=packed_seq_params(self.cu_seqlens, self.max_seqlen),
            **(self.extras or {}),
        )

    def with_images(self, positions: torch.Tensor, filled: torch.Tensor, **images: torch.Tensor) -> "ModelInput":
        """This layout with a vision-language model's inputs: the 3D positions [3, B, S] and the mask [B, S] of the
        positions the image features fill, both given on the padded grid and moved to the computed layout (packed:
        each real token's column of the packed sequence; padding positions 0), and the images themselves."""
        b, s = self.input_ids.shape
        moved = torch.zeros(3, b * s, dtype=positions.dtype, device=positions.device)
        moved[:, self.flat] = positions[:, self.rows, self.cols]
        where = torch.zeros(b * s, dtype=torch.bool, device=filled.device)
        where[self.flat] = filled[self.rows, self.cols]
        extras = dict(images, image_mask=where.view(b, s))
        return dataclasses.replace(self, position_ids=moved.view(3, b, s), extras=extras)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Per-position values of this CP rank [b, s / CP, *] -> the whole computed layout [b, s, *]."""
        if self.cp_index is None:
            return values
        from .context_parallel import gather_positions

        return gather_positions(values, self.cp_index, self.length)

    def restore(self, output: torch.Tensor) -> torch.Tensor:
        """Values of the whole computed layout [b, s, *] back on [B, S, *]; positions without a real token get 0."""
        flat = output.reshape(-1, *output.shape[2:])
        full = output.new_zeros(self.shape + tuple(output.shape[2:]))
        return full.index_put((self.rows, self.cols), flat[self.flat])

    def restore_next(self, output: torch.Tensor) -> torch.Tensor:
        """Values computed at each real token placed on the grid at the next token of its row (what predicts
        or values token t sits at t); positions whose predecessor is not a real token of the row get 0."""
        flat = output.reshape(-1, *output.shape[2:])
        full = output.new_zeros(self.shape + tuple(output.shape[2:]))
        keep = self.has_next
        return full.index_put((self.rows[keep], self.cols[keep] + 1), flat[self.flat[keep]])

    def split_context_parallel(self, cp: int, rank: int) -> "ModelInput":
        """This CP rank's positions (megatron's load-balanced 2 x CP chunks of every segment)."""
        from .context_parallel import rank_positions

        if self.cu_seqlens is not None:
            bounds = self.cu_seqlens.tolist()
            segments = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
        else:
            segments = [self.input_ids.shape[1]]
        index = torch.stack([rank_positions(segments, cp, r) for r in range(cp)]).to(self.input_ids.device)
        own = index[rank]
        return dataclasses.replace(
            self,
            input_ids=self.input_ids[:, own],
            position_ids=self.position_ids[:, own],
            labels=self.labels[:, own],
            length=self.input_ids.shape[1],
            cp_index=index,
        )


def _with_labels(model_input: ModelInput, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelInput:
    """Fill in ``labels`` and ``has_next`` of a layout from the grid it was built from."""
    mask = attention_mask.bool()
    rows, cols = model_input.rows, model_input.cols
    nxt = (cols + 1).clamp(max=mask.shape[1] - 1)
    has_next = (cols + 1 < mask.shape[1]) & mask[rows, nxt]
    labels = torch.zeros(model_input.input_ids.numel(), dtype=input_ids.dtype, device=input_ids.device)
    labels[model_input.flat[has_next]] = input_ids[rows[has_next], cols[has_next] + 1]
    model_input.labels = labels.view_as(model_input.input_ids)
    model_input.has_next = has_next
    model_input.length = model_input.input_ids.shape[1]
    return model_input


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


def round_up(n: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is >= n."""
    return -(-n // multiple) * multiple


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    multiple: int = 1,
    pad_id: int = 0,
    row_multiple: int = 1,
) -> ModelInput:
    """Valid tokens of every row, in order, as one sequence. Each row's segment is rounded up to
    ``row_multiple`` tokens (context parallelism splits every segment into 2 x CP chunks) and the whole
    length to ``multiple`` (sequence parallelism); the padding sits at the end of a segment or in a filler
    segment of its own, where causal attention keeps it from every real token."""
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    kept = lengths[lengths > 0].tolist()
    padded = [round_up(n, row_multiple) for n in kept]
    total = sum(padded)
    length = round_up(max(total, 1), math.lcm(multiple, row_multiple))
    device = input_ids.device
    rows, cols = mask.nonzero(as_tuple=True)
    starts = torch.tensor([0] + padded[:-1], dtype=torch.long, device=device).cumsum(0)
    row_start = torch.zeros(mask.shape[0], dtype=torch.long, device=device)
    row_start[lengths > 0] = starts
    flat = row_start[rows] + (mask.long().cumsum(1) - 1)[rows, cols]  # the row's real tokens, in order
    ids = torch.full((1, length), pad_id, dtype=input_ids.dtype, device=device)
    ids[0, flat] = input_ids[rows, cols]
    positions = torch.zeros(1, length, dtype=torch.long, device=device)
    positions[0, flat] = position_ids_from_mask(attention_mask)[rows, cols]
    bounds = [0] + torch.tensor(padded, dtype=torch.long).cumsum(0).tolist()
    if length > bounds[-1]:
        bounds.append(length)
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    packed = ModelInput(
        ids, positions, None, rows, cols, flat, tuple(attention_mask.shape), cu, int((cu[1:] - cu[:-1]).max())
    )
    return _with_labels(packed, input_ids, attention_mask)


def trim(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, multiple: int = 1, drop_padding_columns: bool = True
) -> ModelInput:
    """The rows as rows: without the columns that are padding in all of them (``drop_padding_columns``),
    then widened with padding columns to a multiple of ``multiple`` (sequence / context parallelism)."""
    if drop_padding_columns:
        valid_cols = attention_mask.bool().any(0).nonzero().flatten()
        lo, hi = (int(valid_cols[0]), int(valid_cols[-1]) + 1) if valid_cols.numel() else (0, 1)
    else:
        lo, hi = 0, attention_mask.shape[1]
    ids, mask = input_ids[:, lo:hi], attention_mask[:, lo:hi]
    extra = round_up(hi - lo, multiple) - (hi - lo)
    if extra:
        ids = torch.nn.functional.pad(ids, (0, extra))
        mask = torch.nn.functional.pad(mask, (0, extra))
    b, s = mask.shape
    rows, local_cols = mask.bool().nonzero(as_tuple=True)
    trimmed = ModelInput(
        ids,
        position_ids_from_mask(mask),
        megatron_attention_mask(mask),
        rows,
        local_cols + lo,
        rows * s + local_cols,
        tuple(attention_mask.shape),
    )
    return _with_labels(trimmed, input_ids, attention_mask)


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
