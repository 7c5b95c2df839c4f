"""What a model family is: the HF <-> Megatron maps and the few switches that differ between families.

A decoder layer is mapped in two halves, both in megatron-core's local-spec names:

    attention   q/k/v_proj (+ bias)      <-> self_attention.linear_qkv   [q of a group's heads; k; v] per group
                q_norm, k_norm           <-> self_attention.q_layernorm, k_layernorm   (qk-layernorm families)
                o_proj                   <-> self_attention.linear_proj
    dense MLP   cat(gate_proj, up_proj)  <-> mlp.linear_fc1 ;  down_proj <-> mlp.linear_fc2
    MoE MLP     mlp.gate                 <-> mlp.router
                experts.{e}.gate/up/down <-> mlp.experts.local_experts.{e}.linear_fc1 / linear_fc2

Names are global (expert ``e`` of ``num_experts``, layer ``i`` of ``num_layers``); the TP, PP and EP
splits are the checkpoint layer's business (``checkpoint/tp_split.py``, ``checkpoint/convert.py``).
A family module subclasses :class:`ModelFamily`, sets its switches and overrides what differs.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ..config_cls.model_config import ModelConfig

Tensors = Dict[str, torch.Tensor]
HF_LAYER = "model.layers.{i}."
MG_LAYER = "decoder.layers.{i}."
EMBED = ("model.embed_tokens.weight", "embedding.word_embeddings.weight")
FINAL_NORM = ("model.norm.weight", "decoder.final_layernorm.weight")
OUTPUT_MG = "output_layer.weight"
EXPERT_MG = "mlp.experts.local_experts.{e}."


class FamilyError(ValueError):
    """A HF config or model section that does not fit the family it names."""


class ModelFamily:
    """One architecture family. Subclasses set the class attributes and override the hooks that differ."""

    name: str = ""
    #: spellings accepted for ``model_type_hf`` / ``--model-type-hf`` (MindSpeed-LLM's names among them)
    aliases: Tuple[str, ...] = ()
    #: config.json ``model_type`` values this family reads
    hf_model_types: Tuple[str, ...] = ()
    architecture: str = ""
    #: the templates.json entry to use for this family's chat models
    chat_template: str = "empty"
    qkv_bias: bool = False
    qk_layernorm: bool = False
    moe: bool = False

    # ------------------------------------------------------------------ configs
    def model_config_from_hf(self, hf: dict) -> ModelConfig:
        """The model section of a HF config.json of this family."""
        heads = hf["num_attention_heads"]
        kv = hf.get("num_key_value_heads") or heads
        head_dim = hf.get("head_dim")
        if head_dim and head_dim == hf["hidden_size"] // heads:
            head_dim = None
        values = dict(
            num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
            ffn_hidden_size=hf["intermediate_size"], num_attention_heads=heads,
            max_position_embeddings=hf.get("max_position_embeddings", 4096), padded_vocab_size=hf["vocab_size"],
            make_vocab_size_divisible_by=1, kv_channels=head_dim, group_query_attention=kv != heads,
            num_query_groups=kv if kv != heads else None, rotary_base=float(rope_theta(hf)), normalization="RMSNorm",
            norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)), swiglu=True,
            add_qkv_bias=self.qkv_bias or bool(hf.get("attention_bias", False)), disable_bias_linear=True,
            qk_layernorm=self.qk_layernorm,
            untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", False), model_type_hf=self.name)
        values.update(self.extra_model_fields(hf))
        cfg = ModelConfig(**values)
        cfg.validate()
        return cfg

    def extra_model_fields(self, hf: dict) -> dict:
        """Family-specific model-section fields read from a HF config (rope scaling, experts)."""
        return {}

    def hf_config(self, model: ModelConfig, eos_token_id: int, pad_token_id: int,
                  torch_dtype: str = "float32") -> dict:
        """The HF config.json of a model section: what vLLM loads and what save_hf / mcore -> hf write."""
        config = {
            "architectures": [self.architecture], "model_type": self.hf_model_types[0],
            "hidden_size": model.hidden_size, "intermediate_size": model.ffn_hidden_size,
            "num_hidden_layers": model.num_layers, "num_attention_heads": model.num_attention_heads,
            "num_key_value_heads": model.kv_heads, "head_dim": model.head_dim, "vocab_size": model.padded_vocab_size,
            "max_position_embeddings": model.max_position_embeddings, "rms_norm_eps": float(model.norm_epsilon),
            "rope_theta": float(model.rotary_base), "tie_word_embeddings": not model.untie_embeddings_and_output_weights,
            "eos_token_id": eos_token_id, "pad_token_id": pad_token_id, "bos_token_id": eos_token_id,
            "torch_dtype": torch_dtype, "hidden_act": "silu", "attention_bias": model.add_qkv_bias,
        }
        config.update(self.extra_hf_fields(model))
        return config

    def extra_hf_fields(self, model: ModelConfig) -> dict:
        return {}

    def transformer_config_fields(self, model: ModelConfig) -> dict:
        """megatron-core TransformerConfig fields this family sets beyond the common ones."""
        return {"qk_layernorm": model.qk_layernorm}

    def check(self, model: ModelConfig, path: str = "model") -> None:
        """Refuse a model section that contradicts the family (raises ConfigError naming the key)."""
        from ..config_cls.base import ConfigError

        if self.qk_layernorm and not model.qk_layernorm:
            raise ConfigError(f"{path}.qk_layernorm", f"{self.name} models normalise q and k per head; set true")
        if model.num_experts and not self.moe:
            raise ConfigError(f"{path}.num_experts", f"{self.name} is a dense family; use a MoE family "
                                                     "(qwen3_moe) for experts")
        if self.moe and not model.num_experts:
            raise ConfigError(f"{path}.num_experts", f"{self.name} is a mixture-of-experts family; set num_experts")

    def vllm_head_dim(self, model: ModelConfig) -> int:
        """The head dimension vLLM's implementation of this family computes with."""
        return model.head_dim

    def vllm_unusable_reason(self, model: ModelConfig) -> Optional[str]:
        """Why vLLM's implementation of this family cannot run ``model`` (None when it can)."""
        return None

    def post_build(self, gpt, model: ModelConfig) -> None:
        """Adjust a built megatron GPTModel for what TransformerConfig cannot express (none by default)."""

    # ------------------------------------------------------------------ weights
    def hf_layer_names(self, i: int, cfg: ModelConfig) -> List[str]:
        p = HF_LAYER.format(i=i)
        names = [p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                 p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                 p + "self_attn.o_proj.weight"]
        if cfg.add_qkv_bias:
            names += [p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"]
        if cfg.qk_layernorm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        return names + self._mlp_names_hf(p, cfg)

    def _mlp_names_hf(self, p: str, cfg: ModelConfig) -> List[str]:
        if cfg.num_experts:
            names = [p + "mlp.gate.weight"]
            for e in range(cfg.num_experts):
                q = f"{p}mlp.experts.{e}."
                names += [q + "gate_proj.weight", q + "up_proj.weight", q + "down_proj.weight"]
            return names
        return [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]

    def layer_hf_to_mcore(self, i: int, hf: Tensors, cfg: ModelConfig) -> Tensors:
        """Megatron weights of layer ``i`` (global layer and expert numbers) from its HF tensors."""
        h, m = HF_LAYER.format(i=i), MG_LAYER.format(i=i)
        out = {
            m + "input_layernorm.weight": hf[h + "input_layernorm.weight"],
            m + "pre_mlp_layernorm.weight": hf[h + "post_attention_layernorm.weight"],
            m + "self_attention.linear_qkv.weight": qkv_to_mcore(hf[h + "self_attn.q_proj.weight"],
                                                                 hf[h + "self_attn.k_proj.weight"],
                                                                 hf[h + "self_attn.v_proj.weight"], cfg),
            m + "self_attention.linear_proj.weight": hf[h + "self_attn.o_proj.weight"],
        }
        if cfg.add_qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = qkv_to_mcore(hf[h + "self_attn.q_proj.bias"],
                                                                     hf[h + "self_attn.k_proj.bias"],
                                                                     hf[h + "self_attn.v_proj.bias"], cfg)
        if cfg.qk_layernorm:
            out[m + "self_attention.q_layernorm.weight"] = hf[h + "self_attn.q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[h + "self_attn.k_norm.weight"]
        if cfg.num_experts:
            out[m + "mlp.router.weight"] = hf[h + "mlp.gate.weight"]
            for e in range(cfg.num_experts):
                q, x = f"{h}mlp.experts.{e}.", m + EXPERT_MG.format(e=e)
                out[x + "linear_fc1.weight"] = torch.cat([hf[q + "gate_proj.weight"], hf[q + "up_proj.weight"]])
                out[x + "linear_fc2.weight"] = hf[q + "down_proj.weight"]
        else:
            out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]])
            out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
        return out

    def layer_mcore_to_hf(self, i: int, mg: Tensors, cfg: ModelConfig) -> Tensors:
        """HF tensors of layer ``i`` from its megatron weights (global layer and expert numbers)."""
        h, m = HF_LAYER.format(i=i), MG_LAYER.format(i=i)
        q, k, v = qkv_from_mcore(mg[m + "self_attention.linear_qkv.weight"], cfg)
        out = {
            h + "input_layernorm.weight": mg[m + "input_layernorm.weight"],
            h + "post_attention_layernorm.weight": mg[m + "pre_mlp_layernorm.weight"],
            h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k, h + "self_attn.v_proj.weight": v,
            h + "self_attn.o_proj.weight": mg[m + "self_attention.linear_proj.weight"],
        }
        if cfg.add_qkv_bias:
            qb, kb, vb = qkv_from_mcore(mg[m + "self_attention.linear_qkv.bias"], cfg)
            out.update({h + "self_attn.q_proj.bias": qb, h + "self_attn.k_proj.bias": kb,
                        h + "self_attn.v_proj.bias": vb})
        if cfg.qk_layernorm:
            out[h + "self_attn.q_norm.weight"] = mg[m + "self_attention.q_layernorm.weight"]
            out[h + "self_attn.k_norm.weight"] = mg[m + "self_attention.k_layernorm.weight"]
        if cfg.num_experts:
            out[h + "mlp.gate.weight"] = mg[m + "mlp.router.weight"]
            for e in range(cfg.num_experts):
                x, p = m + EXPERT_MG.format(e=e), f"{h}mlp.experts.{e}."
                gate, up = mg[x + "linear_fc1.weight"].chunk(2, dim=0)
                out.update({p + "gate_proj.weight": gate, p + "up_proj.weight": up,
                            p + "down_proj.weight": mg[x + "linear_fc2.weight"]})
        else:
            gate, up = mg[m + "mlp.linear_fc1.weight"].chunk(2, dim=0)
            out.update({h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
                        h + "mlp.down_proj.weight": mg[m + "mlp.linear_fc2.weight"]})
        return {name: t.contiguous() for name, t in out.items()}


def rope_theta(hf: dict) -> float:
    """RoPE base of a HF config (transformers 5 moved it into ``rope_parameters``)."""
    if "rope_theta" in hf:
        return hf["rope_theta"]
    return (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)


def rope_parameters(hf: dict) -> dict:
    """The rope-scaling block of a HF config (``rope_scaling``, or ``rope_parameters`` in transformers 5)."""
    return dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})


def qkv_to_mcore(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """[q of group g's heads; k_g; v_g] for every query group g, as megatron's linear_qkv stores them."""
    groups, d = cfg.kv_heads, cfg.head_dim
    per = cfg.num_attention_heads // groups
    tail = q.shape[1:]
    q = q.reshape(groups, per * d, *tail)
    k = k.reshape(groups, d, *tail)
    v = v.reshape(groups, d, *tail)
    return torch.cat([q, k, v], dim=1).reshape(-1, *tail)


def qkv_from_mcore(qkv: torch.Tensor, cfg: ModelConfig):
    groups, d = cfg.kv_heads, cfg.head_dim
    per = cfg.num_attention_heads // groups
    tail = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per + 2) * d, *tail)
    q, k, v = torch.split(grouped, [per * d, d, d], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)
