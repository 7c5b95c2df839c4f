"""Core attention for multi-latent attention (MLA, DeepSeek-V3) in megatron-core's local layer spec.

megatron-core's MLA hands its core attention queries and keys of one head size (the no-RoPE part plus the RoPE
part, ``qk_head_dim + qk_pos_emb_head_dim``) and values of another (``v_head_dim``), with the YaRN-scaled softmax
scale; its local ``DotProductAttention`` accepts neither (it takes them through Transformer Engine on CUDA and
MindSpeed on NPU). This module computes, per head,

    attention(q, K, V) = softmax(q K^T * scale + mask) V        q, k: [.., dk]   v: [.., dv]

for the padded [s, b] layout (megatron's own mask convention: True = masked, filled with -10000 before an fp32
softmax, as its local attention does) and for packed "thd" rows (causal inside each row).
"""

from __future__ import annotations

import math

import torch
from megatron.core.transformer.module import MegatronModule

from .attention import packed_rows_attention


class LatentDotProductAttention(MegatronModule):
    """Attention whose query/key head size (``k_channels``) differs from the value's (``v_channels``)."""

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type,
        attention_type: str,
        attention_dropout=None,
        softmax_scale=None,
        k_channels=None,
        v_channels=None,
        cp_comm_type=None,
        pg_collection=None,
    ):
        super().__init__(config=config)
        tp = pg_collection.tp.size() if pg_collection is not None else config.tensor_model_parallel_size
        self.heads = config.num_attention_heads // tp
        self.v_channels = v_channels or config.kv_channels
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(k_channels or config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        dropout = self.dropout if self.training else 0.0
        if packed_seq_params is not None:
            if packed_seq_params.qkv_format != "thd":
                raise ValueError(
                    f"packed sequences in {packed_seq_params.qkv_format!r} format: only 'thd' is supported"
                )
            out = packed_rows_attention(query, key, value, packed_seq_params.cu_seqlens_q, self.softmax_scale, dropout)
            return out.reshape(out.shape[0], self.heads * self.v_channels)
        sq, b = query.shape[:2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.softmax_scale
        if self.config.attention_softmax_in_fp32:
            scores = scores.float()
        if attention_mask is None:
            attention_mask = torch.ones(sq, k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        probs = torch.softmax(scores.masked_fill(attention_mask, -10000.0), dim=-1).to(v.dtype)
        if dropout:
            from megatron.core.tensor_parallel import get_cuda_rng_tracker

            with get_cuda_rng_tracker().fork():
                probs = torch.nn.functional.dropout(probs, p=dropout)
        ctx = torch.matmul(probs, v)  # [b, h, s, dv]
        return ctx.permute(2, 0, 1, 3).reshape(sq, b, self.heads * self.v_channels)


def with_latent_attention(spec):
    """A layer spec (or a block spec's layer specs) whose MLA core attention is :class:`LatentDotProductAttention`."""
    for layer in getattr(spec, "layer_specs", None) or [spec]:
        attention = getattr(layer.submodules, "self_attention", None)
        submodules = getattr(attention, "submodules", None)
        if submodules is not None and hasattr(submodules, "linear_kv_down_proj"):
            submodules.core_attention = LatentDotProductAttention
    return spec


def latent_block_spec(model, config, stage=None, transformer_engine: bool = False):
    """DeepSeek-V3's decoder block (its family's layer spec): megatron's block spec, one spec per layer of this stage
    (multi-latent attention; the first ``first_k_dense_replace`` layers dense, the rest MoE), with our MLA core
    attention in the local spec. ``stage``: the virtual-stage arguments."""
    from megatron.core.models.gpt import gpt_layer_specs

    block = gpt_layer_specs.get_gpt_decoder_block_spec(
        config, use_transformer_engine=transformer_engine, normalization=model.normalization, **(stage or {})
    )
    return block if transformer_engine else with_latent_attention(block)


__all__ = ["LatentDotProductAttention", "latent_block_spec", "with_latent_attention"]
