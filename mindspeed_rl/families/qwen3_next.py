"""Qwen3-Next: Gated DeltaNet linear attention in three of every four layers, gated full attention in the fourth, a
routed MoE with a gated shared expert in every layer, norms stored zero-centred (applied as 1 + w).

Full attention: ``q_proj`` gives each head its query and an output gate, ``[q_h; gate_h]``; megatron-core's gated
attention (``attention_output_gate``) packs them per query group as ``[q heads; gate heads; k; v]`` in
``linear_qkv`` and multiplies the attention output by sigmoid(gate). RoPE on the first ``partial_rotary_factor`` of
each head (``rotary_percent``).

Linear attention (``models/gated_delta_net.py``): ``in_proj_qkvz``, ``in_proj_ba``, ``dt_bias``, ``A_log``, the gated
norm and ``out_proj`` map one to one; ``conv1d``'s channels are reordered from the checkpoint's ``[q; k; v]`` to
megatron's per-key-head ``[q_g; k_g; v_g]`` (a permutation: the round trip is exact).

MoE: p = softmax(router(x)), top-k renormalised (``norm_topk_prob``); plus sigmoid(shared_expert_gate(x)) times the
shared expert's MLP (megatron's ``moe_shared_expert_gate``). Multi-token-prediction tensors (``mtp.*``) are not
trained: the converters read past them and say how many.
"""

from __future__ import annotations

from typing import List

import torch

from ..config_cls.model_config import ModelConfig
from .base import HF_LAYER, MG_LAYER, FamilyError, LayerNames, ModelFamily, rope_parameters
from .qwen3_moe import Qwen3Moe

_LINEAR = [
    ("linear_attn.in_proj_qkvz.weight", "self_attention.in_proj_qkvz.weight"),
    ("linear_attn.in_proj_ba.weight", "self_attention.in_proj_ba.weight"),
    ("linear_attn.conv1d.weight", "self_attention.conv1d.weight"),
    ("linear_attn.dt_bias", "self_attention.dt_bias"),
    ("linear_attn.A_log", "self_attention.A_log"),
    ("linear_attn.norm.weight", "self_attention.out_norm.weight"),
    ("linear_attn.out_proj.weight", "self_attention.out_proj.weight"),
]
_CONV = "self_attention.conv1d.weight"
# Gated DeltaNet's sizes: one name in config.json, the model section and megatron-core's TransformerConfig
LINEAR_SIZES = (
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
)


def linear_sizes(model: ModelConfig) -> dict:
    return {key: getattr(model, key) for key in LINEAR_SIZES}


def attention_period(hf: dict, family: str) -> int:
    """n such that every n-th layer (and only those) is full attention, from ``layer_types`` or
    ``full_attention_interval``; FamilyError for another pattern."""
    layers = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if not types:
        return int(hf.get("full_attention_interval", 4))
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    period = full[0] + 1 if full else 0
    if not period or [i for i in range(layers) if (i + 1) % period == 0] != full:
        raise FamilyError(
            f"{family} layer_types with full attention at layers {full}: only every n-th layer is supported"
        )
    return period


class GatedDeltaNetHybrid(ModelFamily):
    """What Qwen3-Next and Qwen3.5 share: the layer pattern, Gated DeltaNet, gated attention with partial RoPE,
    zero-centred norms (mixed in before Qwen3-MoE for the MoE families; on its own for dense Qwen3.5)."""

    chat_template = "qwen3"
    qk_layernorm = True
    layer_spec = "mindspeed_rl.models.gated_delta_net:hybrid_block_spec"
    # whole key-head groups per rank (models/gated_delta_net.py); the output projection row-parallel
    tp_rules = (
        (r"self_attention\.(in_proj_qkvz\.weight|in_proj_ba\.weight|conv1d\.weight|dt_bias|A_log)$", "dim0"),
        (r"self_attention\.out_proj\.weight$", "dim1"),
    )

    def linear_attention_parameters(self, model: ModelConfig) -> int:
        """One Gated DeltaNet layer: in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj."""
        k = model.linear_key_head_dim * model.linear_num_key_heads
        v, heads = model.linear_value_head_dim * model.linear_num_value_heads, model.linear_num_value_heads
        projections = model.hidden_size * (2 * k + 2 * v + 2 * heads) + v * model.hidden_size
        return projections + (2 * k + v) * model.linear_conv_kernel_dim + 2 * heads + model.linear_value_head_dim

    def extra_model_fields(self, hf: dict) -> dict:
        rope = rope_parameters(hf)
        ratio = hf.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25))
        return {
            **super().extra_model_fields(hf),
            "linear_attention_freq": attention_period(hf, self.name),
            **{key: int(hf[key]) for key in LINEAR_SIZES},
            "attention_output_gate": True,
            "layernorm_zero_centered_gamma": True,
            "rotary_percent": float(ratio),
        }

    def extra_hf_fields(self, model: ModelConfig) -> dict:
        freq = model.linear_attention_freq
        return {
            **super().extra_hf_fields(model),
            "layer_types": [
                "linear_attention" if model.is_linear_attention_layer(i) else "full_attention"
                for i in range(model.num_layers)
            ],
            "full_attention_interval": freq,
            **linear_sizes(model),
            "partial_rotary_factor": model.rotary_percent,
        }

    def transformer_config_fields(self, model: ModelConfig) -> dict:
        return {
            **super().transformer_config_fields(model),
            "attention_output_gate": True,
            **linear_sizes(model),
        }

    def required_keys(self, model: ModelConfig) -> dict:
        return {
            "linear_attention_freq": bool(model.linear_attention_freq),
            "attention_output_gate": model.attention_output_gate,
            "layernorm_zero_centered_gamma": model.layernorm_zero_centered_gamma,
        }

    def check(self, model: ModelConfig, path: str = "model") -> None:
        from ..config_cls.base import ConfigError

        super().check(model, path)
        for key, given in self.required_keys(model).items():
            if not given:
                raise ConfigError(
                    f"{path}.{key}", f"{self.name} models need it set (true, or the size config.json gives)"
                )
        if model.linear_num_value_heads % model.linear_num_key_heads:
            raise ConfigError(
                f"{path}.linear_num_value_heads",
                f"{model.linear_num_value_heads} is not a multiple of linear_num_key_heads "
                f"{model.linear_num_key_heads}",
            )

    def untrained_hf_names(self, hf_names, cfg: ModelConfig) -> List[str]:
        """Multi-token-prediction tensors (``mtp.*``): not trained here."""
        return [n for n in hf_names if n.startswith("mtp.")]

    # ------------------------------------------------------------------ weights
    def layer_names(self, i: int, cfg: ModelConfig) -> LayerNames:
        h, m = HF_LAYER.format(i=i), MG_LAYER.format(i=i)
        names = super().layer_names(i, cfg)
        renamed, qkv = list(names.renamed), list(names.qkv)
        if cfg.is_linear_attention_layer(i):  # a Gated DeltaNet layer in the place of attention
            renamed = [(hf, mg) for hf, mg in renamed if ".self_attn." not in hf]
            renamed += [(h + hf, m + mg) for hf, mg in _LINEAR]
            qkv = []
        if not cfg.moe_shared_expert_intermediate_size:
            return LayerNames(renamed, qkv, names.fc1)
        shared_hf, shared_mg = h + "mlp.shared_expert.", m + "mlp.shared_experts."
        renamed += [
            (shared_hf + "down_proj.weight", shared_mg + "linear_fc2.weight"),
            (h + "mlp.shared_expert_gate.weight", shared_mg + "gate_weight"),
        ]
        fc1 = names.fc1 + [
            ((shared_hf + "gate_proj.weight", shared_hf + "up_proj.weight"), shared_mg + "linear_fc1.weight")
        ]
        return LayerNames(renamed, qkv, fc1)

    def qkv_to_mcore(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        """[q heads; gate heads; k; v] per query group from q_proj's per-head [q_h; gate_h]."""
        groups, d, tail = cfg.kv_heads, cfg.head_dim, q.shape[1:]
        per = cfg.num_attention_heads // groups
        q = q.reshape(groups, per, 2, d, *tail).transpose(1, 2).reshape(groups, 2 * per * d, *tail)
        k, v = k.reshape(groups, d, *tail), v.reshape(groups, d, *tail)
        return torch.cat([q, k, v], dim=1).reshape(-1, *tail)

    def qkv_from_mcore(self, qkv: torch.Tensor, cfg: ModelConfig):
        groups, d, tail = cfg.kv_heads, cfg.head_dim, qkv.shape[1:]
        per = cfg.num_attention_heads // groups
        q, k, v = qkv.reshape(groups, (2 * per + 2) * d, *tail).split([2 * per * d, d, d], dim=1)
        q = q.reshape(groups, 2, per, d, *tail).transpose(1, 2)
        return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)

    def layer_hf_to_mcore(self, i: int, hf, cfg: ModelConfig):
        out = super().layer_hf_to_mcore(i, hf, cfg)
        conv = MG_LAYER.format(i=i) + _CONV
        if conv in out:
            q, k, v = out[conv].split(_conv_blocks(cfg), dim=0)
            groups, tail = cfg.linear_num_key_heads, q.shape[1:]
            out[conv] = torch.cat([t.reshape(groups, -1, *tail) for t in (q, k, v)], dim=1).reshape(-1, *tail)
        return out

    def layer_mcore_to_hf(self, i: int, mg, cfg: ModelConfig):
        conv = MG_LAYER.format(i=i) + _CONV
        if conv in mg:
            groups, (key, _, value) = cfg.linear_num_key_heads, _conv_blocks(cfg)
            grouped = mg[conv].reshape(groups, -1, *mg[conv].shape[1:])
            q, k, v = grouped.split([key // groups, key // groups, value // groups], dim=1)
            tail = mg[conv].shape[1:]
            mg = {**mg, conv: torch.cat([t.reshape(-1, *tail) for t in (q, k, v)])}
        return super().layer_mcore_to_hf(i, mg, cfg)


def _conv_blocks(cfg: ModelConfig):
    """The checkpoint's conv1d channel blocks: [q (all key heads); k; v (all value heads)]."""
    key = cfg.linear_key_head_dim * cfg.linear_num_key_heads
    return [key, key, cfg.linear_value_head_dim * cfg.linear_num_value_heads]


class Qwen3Next(GatedDeltaNetHybrid, Qwen3Moe):
    name = "qwen3_next"
    aliases = ("qwen3-next", "qwen3next")
    hf_model_types = ("qwen3_next",)
    architecture = "Qwen3NextForCausalLM"

    def extra_model_fields(self, hf: dict) -> dict:
        return {
            **super().extra_model_fields(hf),
            "norm_topk_prob": bool(hf.get("norm_topk_prob", True)),  # transformers' Qwen3-Next default
            "moe_shared_expert_intermediate_size": int(hf["shared_expert_intermediate_size"]),
            "moe_shared_expert_gate": True,
        }

    def extra_hf_fields(self, model: ModelConfig) -> dict:
        return {
            **super().extra_hf_fields(model),
            "shared_expert_intermediate_size": model.moe_shared_expert_intermediate_size,
        }

    def transformer_config_fields(self, model: ModelConfig) -> dict:
        return {
            **super().transformer_config_fields(model),
            "moe_shared_expert_intermediate_size": model.moe_shared_expert_intermediate_size,
            "moe_shared_expert_gate": model.moe_shared_expert_gate,
        }

    def required_keys(self, model: ModelConfig) -> dict:
        return {
            **super().required_keys(model),
            "moe_shared_expert_intermediate_size": bool(model.moe_shared_expert_intermediate_size),
            "moe_shared_expert_gate": model.moe_shared_expert_gate,
        }
