"""Core attention for the local (non-Transformer-Engine) layer spec that also takes packed sequences.

megatron-core's local ``DotProductAttention`` refuses ``packed_seq_params``; Transformer Engine's accepts
them but is CUDA-only. ``PackedDotProductAttention`` runs the padded [s, b] path exactly as megatron does and,
for the packed "thd" format (rows concatenated, ``cu_seqlens`` marking where each starts), attends inside each
row only with torch's scaled_dot_product_attention (causal): the cost is sum(L_i^2), not T^2, and no
[T, T] mask is built.

    attention(q_i, K_i, V_i) = softmax(q_i K_i^T * scale + causal) V_i      for each packed row i
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention


class PackedDotProductAttention(DotProductAttention):
    """megatron's DotProductAttention plus the "thd" packed format (query [t, np, hn], key/value [t, ng, hn])."""

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, None)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed sequences in {packed_seq_params.qkv_format!r} format: only 'thd' is supported")
        heads, groups = self.num_attention_heads_per_partition, self.num_query_groups_per_partition
        if heads != groups:  # grouped-query attention: each key/value head serves heads // groups query heads
            key = key.repeat_interleave(heads // groups, dim=1)
            value = value.repeat_interleave(heads // groups, dim=1)
        dropout = self.config.attention_dropout if self.training else 0.0
        out = packed_rows_attention(query, key, value, packed_seq_params.cu_seqlens_q, self.softmax_scale, dropout)
        return out.reshape(out.shape[0], self.hidden_size_per_partition)


def packed_rows_attention(query, key, value, cu_seqlens, scale, dropout: float) -> torch.Tensor:
    """Causal attention inside each packed row (query [t, h, dk], key [t, h, dk], value [t, h, dv], as many key/value
    heads as query heads) -> [t, h, dv]; positions after the last row give zeros."""
    bounds = cu_seqlens.tolist()
    sizes = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    tail = query.shape[0] - bounds[-1]  # positions after the last row (padding to a multiple): zeros
    # split, not slicing: the backward of a split is one concatenation, where each slice's would be a
    # zero-filled gradient of the whole packed sequence, summed over rows (a memory-bound storm on GPU)
    rows = zip(*(t.split(sizes + [tail] if tail else sizes) for t in (query, key, value)))
    pieces = []
    for q, k, v in rows:
        if len(pieces) == len(sizes):
            pieces.append(q.new_zeros(*q.shape[:-1], v.shape[-1]))
        elif q.shape[0] == 0:
            pieces.append(v)
        else:
            # [L, h, d] -> [1, h, L, d]: with a batch dimension torch picks its flash kernel (CPU too), whose
            # memory grows with L, not L^2 (3-D inputs fall back to the math path)
            q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale)
            pieces.append(ctx[0].transpose(0, 1))
    return torch.cat(pieces)


def packed_seq_params(cu_seqlens: torch.Tensor, max_seqlen: int):
    """megatron's PackedSeqParams of one packed sequence whose rows start at ``cu_seqlens[:-1]``."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = cu_seqlens.to(torch.int32)
    return PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=int(max_seqlen), max_seqlen_kv=int(max_seqlen)
    )


def with_packed_attention(spec):
    """The local layer spec with its core attention able to take packed sequences (same weights, same
    padded numerics)."""
    attention = getattr(spec.submodules, "self_attention", None)
    if attention is not None and getattr(attention, "submodules", None) is not None:
        if attention.submodules.core_attention is DotProductAttention:
            attention.submodules.core_attention = PackedDotProductAttention
    return spec


__all__ = ["PackedDotProductAttention", "packed_seq_params", "with_packed_attention"]
