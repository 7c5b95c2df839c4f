"""Context parallelism: one sequence split over the ranks of a CP group.

Layout (load-balanced for causal attention, megatron's and Transformer Engine's): a sequence (or, packed,
each row) of length L, a multiple of 2 x CP, is cut into 2 x CP equal chunks; CP rank r holds chunks r and
2 x CP - 1 - r, so every rank has as many early (cheap) as late (costly) queries. megatron's RoPE selects
the same positions (``get_pos_emb_on_this_cp_rank``, and per row for the packed "thd" format).

Ulysses (``ulysses_cp_algo``): around the core attention an all-to-all turns [sequence / CP, heads] into
[sequence, heads / CP]; each rank attends over the whole sequence for its heads, and a second all-to-all
turns the result back. Only the all-to-alls cross ranks (they run on gloo, NCCL and HCCL alike)::

    q_r = A2A(q)[:, heads of r]  ->  o_r = attention(q_r, k_r, v_r) over all positions  ->  o = A2A^-1(o_r)

Per-token outputs (log-probs, entropy, values) are computed on each rank's own positions and gathered
(``gather_positions``); its backward hands each rank the gradient of its own positions, so a loss that every
rank computes identically on the gathered tensor back-propagates once per token.
"""

from __future__ import annotations

import copy
from typing import List, Sequence, Tuple

import torch
import torch.distributed as dist
from megatron.core.transformer.module import MegatronModule

from ..features.context_parallel import ulysses_layout
from .attention import PackedDotProductAttention


def cp_world():
    """(group, size, rank) of this rank's context-parallel group (size 1 without megatron's state)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return None, 1, 0
    return ps.get_context_parallel_group(), ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()


def rank_positions(segments: Sequence[int], cp: int, rank: int) -> torch.Tensor:
    """Indices of the positions CP rank ``rank`` holds of a sequence made of ``segments`` (lengths, each a
    multiple of 2 x cp): chunks ``rank`` and ``2 cp - 1 - rank`` of every segment, in that order."""
    parts: List[torch.Tensor] = []
    start = 0
    for length in segments:
        if length % (2 * cp):
            raise ValueError(f"a segment of {length} tokens does not split into 2 x CP {cp} chunks")
        chunk = length // (2 * cp)
        for c in (rank, 2 * cp - 1 - rank):
            parts.append(torch.arange(start + c * chunk, start + (c + 1) * chunk))
        start += length
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


class _AllToAll(torch.autograd.Function):
    """Split ``x`` along ``scatter_dim`` into CP parts, send part j to rank j, concatenate what arrives along
    ``gather_dim`` (in rank order). The backward is the inverse all-to-all."""

    @staticmethod
    def forward(ctx, x, scatter_dim: int, gather_dim: int, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    size = dist.get_world_size(group)
    send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _GatherPositions(torch.autograd.Function):
    """[b, n_local, *] of every CP rank -> [b, n, *] in natural order; backward: this rank's positions."""

    @staticmethod
    def forward(ctx, x, index: torch.Tensor, total: int, group, rank: int):
        ctx.own = index[rank]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        out = x.new_zeros((x.shape[0], total) + tuple(x.shape[2:]))
        out[:, index.reshape(-1).to(x.device)] = torch.cat(parts, dim=1)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.own.to(grad.device)], None, None, None, None


def gather_positions(x: torch.Tensor, index: torch.Tensor, total: int) -> torch.Tensor:
    """Per-position values [b, n_local, *] of this CP rank -> the whole sequence [b, total, *]; ``index``
    [CP, n_local] lists the positions each rank holds (``rank_positions``)."""
    group, size, rank = cp_world()
    if size == 1:
        return x
    return _GatherPositions.apply(x, index, total, group, rank)


class UlyssesAttention(MegatronModule):
    """Core attention with the sequence split over the CP group (``ulysses_cp_algo``).

    Wraps a core attention built for ``heads / CP`` heads on the whole sequence with CP 1 (our
    ``PackedDotProductAttention`` by default, so padded and packed "thd" inputs both work). Query
    [s / CP, b, n, d] or packed [t / CP, n, d]; key and value likewise with the query groups.
    """

    inner_class = PackedDotProductAttention

    def __init__(self, config, layer_number, attn_mask_type, attention_type, cp_comm_type=None, **kwargs):
        super().__init__(config=config)
        from megatron.core import parallel_state as ps

        self.group = ps.get_context_parallel_group()
        self.cp = ps.get_context_parallel_world_size()
        tp = config.tensor_model_parallel_size
        heads, groups = config.num_attention_heads // tp, config.num_query_groups // tp
        reason = ulysses_layout(heads, groups, self.cp)
        if reason:
            raise ValueError(f"context_parallel_size {self.cp} with ulysses_cp_algo: {reason}")
        self.kv_repeat = 1 if groups % self.cp == 0 else self.cp // groups
        inner = copy.copy(config)
        inner.context_parallel_size = 1
        inner.num_attention_heads = config.num_attention_heads // self.cp
        inner.num_query_groups = config.num_query_groups * self.kv_repeat // self.cp
        self.inner = self.inner_class(
            config=inner,
            layer_number=layer_number,
            attn_mask_type=attn_mask_type,
            attention_type=attention_type,
            **kwargs,
        )
        self._positions = {}

    def _order(self, packed_seq_params, length: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(positions in the order the all-to-all delivers them: rank 0's, rank 1's, ...; its inverse, which
        puts them back in natural order), computed once per micro-batch layout, not per layer."""
        if packed_seq_params is not None:
            cu = packed_seq_params.cu_seqlens_q.tolist()
            segments = tuple(b - a for a, b in zip(cu[:-1], cu[1:]))
        else:
            segments = (length,)
        key = (segments, str(device))
        if key not in self._positions:
            order = torch.cat([rank_positions(segments, self.cp, r) for r in range(self.cp)]).to(device)
            natural = torch.empty_like(order)
            natural[order] = torch.arange(order.numel(), device=device)
            self._positions = {key: (order, natural)}  # one layout per micro-batch: keep only the latest
        return self._positions[key]

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        seq_dim, head_dim = 0, query.dim() - 2  # [s, b, n, d] or packed [t, n, d]
        size_per_head = value.shape[-1]  # (TE's core attention keeps no hidden_size_per_attention_head)
        if self.kv_repeat > 1:
            key = key.repeat_interleave(self.kv_repeat, dim=head_dim)
            value = value.repeat_interleave(self.kv_repeat, dim=head_dim)
        q, k, v = (all_to_all(t, head_dim, seq_dim, self.group) for t in (query, key, value))
        order, natural = self._order(packed_seq_params, q.shape[0], q.device)
        q, k, v = (t.index_select(0, natural) for t in (q, k, v))  # whole sequence in natural order
        out = self.inner(q, k, v, attention_mask, attn_mask_type, attention_bias, packed_seq_params)
        out = out.index_select(0, order)  # [S, (b,) n / CP * d] back in rank order
        shape = out.shape
        out = out.reshape(*shape[:-1], -1, size_per_head)
        out = all_to_all(out, seq_dim, out.dim() - 2, self.group)
        return out.reshape(*out.shape[:-2], -1)


def with_ulysses_attention(spec):
    """The layer spec with its core attention run under Ulysses (same weights: the core attention has none)."""
    attention = getattr(spec.submodules, "self_attention", None)
    if attention is not None and getattr(attention, "submodules", None) is not None:
        inner = attention.submodules.core_attention
        attention.submodules.core_attention = type("UlyssesAttention", (UlyssesAttention,), {"inner_class": inner})
    return spec


__all__ = [
    "UlyssesAttention",
    "all_to_all",
    "cp_world",
    "gather_positions",
    "rank_positions",
    "with_ulysses_attention",
]
