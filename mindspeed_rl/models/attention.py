"""Core attention for the local (non-Transformer-Engine) layer spec that also takes packed sequences.

megatron-core's local ``DotProductAttention`` refuses ``packed_seq_params``; Transformer Engine's accepts
them but is CUDA-only. ``PackedDotProductAttention`` runs the padded [s, b] path with megatron's numerics and,
for the packed "thd" format (rows concatenated, ``cu_seqlens`` marking where each starts), attends inside each
row only with torch's scaled_dot_product_attention (causal): the cost is sum(L_i^2), not T^2, and no
[T, T] mask is built.

    attention(q_i, K_i, V_i) = softmax(q_i K_i^T * scale + causal) V_i      for each packed row i

With grouped-query attention (g key/value heads, each serving r = heads / g query heads) the padded path
stacks the r query heads of a group along the rows instead of copying each key/value head r times:

    scores[b, g] = Q[b, g] K[b, g]^T * scale      Q[b, g]: [r x sq, d],  K[b, g]: [sk, d]
    context[b, g] = softmax_masked(scores[b, g]) V[b, g]

the same products, without the repeated keys and values (megatron's ``repeat_interleave``) whose backward is a
strided sum. Where a vendor library patches megatron's core attention (MindSpeed's flash attention on NPU:
``fused_features()["vendor_attention"]``) the padded path stays megatron's forward, patched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention

from ..compat.megatron_core import masked_softmax


class PackedDotProductAttention(DotProductAttention):
    """megatron's DotProductAttention plus the "thd" packed format (query [t, np, hn], key/value [t, ng, hn])."""

    grouped_padded = True  # the padded path attends each query group at once (else: megatron's forward)

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        if packed_seq_params is None:
            grouped = self.num_attention_heads_per_partition > self.num_query_groups_per_partition
            if self.grouped_padded and grouped and attention_bias is None:
                return self.grouped_padded_attention(query, key, value, attention_mask)
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

    def grouped_padded_attention(self, query, key, value, attention_mask):
        """The padded path (query [sq, b, h, d], key/value [sk, b, g, d]) -> [sq, b, h x d], each group's query
        heads stacked along the rows: megatron's scale, masked softmax and dropout, no key/value repeated."""
        sq, b, heads, dim = query.shape
        sk, groups = key.shape[0], key.shape[2]
        rows = heads // groups
        q = query.reshape(sq, b, groups, rows, dim).permute(1, 2, 3, 0, 4).reshape(b * groups, rows * sq, dim)
        k = key.permute(1, 2, 3, 0).reshape(b * groups, dim, sk)
        empty = torch.empty(b * groups, rows * sq, sk, dtype=query.dtype, device=query.device)
        scores = torch.baddbmm(empty, q, k, beta=0.0, alpha=self.softmax_scale).view(b, heads, sq, sk)
        probs = masked_softmax(self, scores, attention_mask)
        if self.config.sequence_parallel:
            probs = self.attention_dropout(probs)
        else:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = self.attention_dropout(probs)
        v = value.permute(1, 2, 0, 3).reshape(b * groups, sk, value.shape[3])
        context = torch.bmm(probs.view(b * groups, rows * sq, sk), v)  # [b g, r sq, d]
        context = context.view(b, heads, sq, -1).permute(2, 0, 1, 3).contiguous()
        return context.view(sq, b, self.hidden_size_per_partition)


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


class VendorPaddedDotProductAttention(PackedDotProductAttention):
    """The padded path left to megatron's forward, which the device's library patches (MindSpeed on NPU)."""

    grouped_padded = False


def with_packed_attention(spec, kind=None):
    """The local layer spec with its core attention able to take packed sequences (same weights, the padded
    path's numerics megatron's), for device ``kind`` (default: this process's)."""
    from ..accelerator import accelerator_class, get_accelerator

    vendor = accelerator_class(kind or get_accelerator().kind).fused_features()["vendor_attention"]
    attention = getattr(spec.submodules, "self_attention", None)
    if attention is not None and getattr(attention, "submodules", None) is not None:
        if attention.submodules.core_attention is DotProductAttention:
            core = VendorPaddedDotProductAttention if vendor else PackedDotProductAttention
            attention.submodules.core_attention = core
    return spec


__all__ = ["PackedDotProductAttention", "VendorPaddedDotProductAttention", "packed_seq_params", "with_packed_attention"]
