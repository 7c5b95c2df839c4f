"""Qwen3.5 (text, ``Qwen3_5ForCausalLM``): Qwen3-Next's hybrid layers (Gated DeltaNet in three of every four layers,
gated full attention with partial RoPE in the fourth, zero-centred norms) over a dense SwiGLU MLP; Qwen3.5-MoE
(``Qwen3_5MoeForCausalLM``) over Qwen3-Next's MoE.

Its Gated DeltaNet keeps the input projections apart: ``in_proj_qkv`` ([q; k; v], each over all heads), ``in_proj_z``,
``in_proj_b`` and ``in_proj_a``. The map regroups them per key head g into megatron's ``in_proj_qkvz``
([q_g; k_g; v_g; z_g]) and ``in_proj_ba`` ([b_g; a_g]), Qwen3-Next's checkpoint layout, an exact permutation; the rest
is Qwen3-Next's map.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from ..config_cls.model_config import ModelConfig
from .base import HF_LAYER
from .fused_experts import FusedExperts
from .qwen3_next import GatedDeltaNetHybrid, Qwen3Next

_SEPARATE = ("qkv", "z", "b", "a")
_LANGUAGE_MODEL = "model.language_model."


class Qwen35(GatedDeltaNetHybrid):
    name = "qwen3_5"
    aliases = ("qwen3.5", "qwen35")
    # the second: a vision-language checkpoint (the Hub's Qwen3.5), read as its text model, as transformers'
    # Qwen3_5ForCausalLM reads it; its vision tower is not converted (counted) and HF exports are text models
    hf_model_types = ("qwen3_5_text", "qwen3_5")
    architecture = "Qwen3_5ForCausalLM"
    untrained_what = "multi-token-prediction layers or the vision tower"

    def model_config_from_hf(self, hf: dict) -> ModelConfig:
        text = dict(hf.get("text_config") or hf)
        if "tie_word_embeddings" in hf:  # a vision-language config keeps it at the top level
            text["tie_word_embeddings"] = hf["tie_word_embeddings"]
        return super().model_config_from_hf(text)

    def hf_name_aliases(self, name: str) -> Tuple[str, ...]:
        return (name, _LANGUAGE_MODEL + name[len("model.") :]) if name.startswith("model.") else (name,)

    def untrained_hf_names(self, hf_names, cfg: ModelConfig) -> List[str]:
        names = list(hf_names)
        return super().untrained_hf_names(names, cfg) + [n for n in names if n.startswith("model.visual.")]

    def hf_layer_names(self, i: int, cfg: ModelConfig) -> List[str]:
        names = super().hf_layer_names(i, cfg)
        if not cfg.is_linear_attention_layer(i):
            return names
        grouped = set(_grouped_names(i))
        return [n for n in names if n not in grouped] + _separate_names(i)

    def layer_hf_to_mcore(self, i: int, hf, cfg: ModelConfig):
        if cfg.is_linear_attention_layer(i):
            qkv, z, b, a = (hf[n] for n in _separate_names(i))
            hf = {**hf, **dict(zip(_grouped_names(i), group_per_key_head(qkv, z, b, a, cfg)))}
        return super().layer_hf_to_mcore(i, hf, cfg)

    def layer_mcore_to_hf(self, i: int, mg, cfg: ModelConfig):
        out = super().layer_mcore_to_hf(i, mg, cfg)
        if cfg.is_linear_attention_layer(i):
            qkvz, ba = (out.pop(n) for n in _grouped_names(i))
            out.update(zip(_separate_names(i), (t.contiguous() for t in separate_per_block(qkvz, ba, cfg))))
        return out


def _grouped_names(i: int) -> List[str]:
    h = HF_LAYER.format(i=i) + "linear_attn."
    return [h + "in_proj_qkvz.weight", h + "in_proj_ba.weight"]


def _separate_names(i: int) -> List[str]:
    return [HF_LAYER.format(i=i) + f"linear_attn.in_proj_{x}.weight" for x in _SEPARATE]


def _sizes(cfg: ModelConfig):
    """(key heads, key head size, value rows per key head, value heads per key head)."""
    groups = cfg.linear_num_key_heads
    ratio = cfg.linear_num_value_heads // groups
    return groups, cfg.linear_key_head_dim, ratio * cfg.linear_value_head_dim, ratio


def group_per_key_head(qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor, cfg: ModelConfig):
    """(in_proj_qkvz, in_proj_ba) grouped per key head from the separate projections."""
    groups, dk, dv, ratio = _sizes(cfg)
    tail = qkv.shape[1:]
    q, k, v = qkv.split([groups * dk, groups * dk, groups * dv])
    blocks = [q.reshape(groups, dk, *tail), k.reshape(groups, dk, *tail), v.reshape(groups, dv, *tail)]
    qkvz = torch.cat(blocks + [z.reshape(groups, dv, *tail)], dim=1).reshape(-1, *tail)
    ba = torch.cat([b.reshape(groups, ratio, *tail), a.reshape(groups, ratio, *tail)], dim=1).reshape(-1, *tail)
    return qkvz, ba


def separate_per_block(qkvz: torch.Tensor, ba: torch.Tensor, cfg: ModelConfig):
    """(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) from the per-key-head groups."""
    groups, dk, dv, ratio = _sizes(cfg)
    tail = qkvz.shape[1:]
    q, k, v, z = qkvz.reshape(groups, -1, *tail).split([dk, dk, dv, dv], dim=1)
    b, a = ba.reshape(groups, 2 * ratio, *tail).split([ratio, ratio], dim=1)
    qkv = torch.cat([t.reshape(-1, *tail) for t in (q, k, v)])
    return qkv, z.reshape(-1, *tail), b.reshape(-1, *tail), a.reshape(-1, *tail)


class Qwen35Moe(FusedExperts, Qwen35, Qwen3Next):
    """Qwen3.5-MoE (text, ``Qwen3_5MoeForCausalLM``): Qwen3.5's separate Gated DeltaNet projections, Qwen3-Next's
    MoE (routed experts plus a gated shared expert). The Hub's checkpoints fuse each layer's experts in the module
    layout (``mlp.experts.gate_up_proj`` [E, 2F, H], ``down_proj`` [E, H, F]); per-expert folders are read too
    (``families/fused_experts.py``)."""

    name = "qwen3_5_moe"
    aliases = ("qwen3.5-moe", "qwen35moe")
    hf_model_types = ("qwen3_5_moe_text", "qwen3_5_moe")
    architecture = "Qwen3_5MoeForCausalLM"

    def model_config_from_hf(self, hf: dict) -> ModelConfig:
        text = dict(hf.get("text_config") or hf)
        # transformers' Qwen3_5MoeTextConfig has no dense MLP size (every layer is MoE; megatron still wants one)
        text.setdefault("intermediate_size", text["moe_intermediate_size"])
        return super().model_config_from_hf({**hf, "text_config": text} if hf.get("text_config") else text)

    def extra_model_fields(self, hf: dict) -> dict:
        # its router always renormalises the top-k weights (transformers' Qwen3_5MoeTopKRouter; no norm_topk_prob key)
        return {**super().extra_model_fields(hf), "norm_topk_prob": True}
