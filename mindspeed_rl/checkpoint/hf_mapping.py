"""HF (Qwen2 / Qwen2.5 / Llama) <-> megatron-core (local spec) weight names, one layer at a time.

    embed_tokens            <-> embedding.word_embeddings
    input_layernorm         <-> input_layernorm
    q_proj, k_proj, v_proj  <-> linear_qkv   (rows grouped per query group: [q heads of g; k_g; v_g])
    o_proj                  <-> linear_proj
    post_attention_layernorm<-> pre_mlp_layernorm
    cat(gate_proj, up_proj) <-> linear_fc1
    down_proj               <-> linear_fc2
    model.norm              <-> decoder.final_layernorm
    lm_head                 <-> output_layer           (score with --orm: the value head)
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ..config_cls.model_config import ModelConfig

Tensors = Dict[str, torch.Tensor]

HF_LAYER = "model.layers.{i}."
MG_LAYER = "decoder.layers.{i}."


def hf_config_dict(model: ModelConfig, eos_token_id: int, pad_token_id: int, torch_dtype: str = "float32") -> dict:
    """The HF config.json of a ModelConfig (Qwen2 family, or Llama when ``model_type_hf`` says llama): what
    vLLM loads for rollout and what save_hf writes next to a checkpoint."""
    arch = "LlamaForCausalLM" if model.model_type_hf.startswith("llama") else "Qwen2ForCausalLM"
    return {
        "architectures": [arch], "model_type": "llama" if arch.startswith("Llama") else "qwen2",
        "hidden_size": model.hidden_size, "intermediate_size": model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers, "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.kv_heads, "vocab_size": model.padded_vocab_size,
        "max_position_embeddings": model.max_position_embeddings, "rms_norm_eps": model.norm_epsilon,
        "rope_theta": model.rotary_base, "tie_word_embeddings": not model.untie_embeddings_and_output_weights,
        "eos_token_id": eos_token_id, "pad_token_id": pad_token_id, "bos_token_id": eos_token_id,
        "torch_dtype": torch_dtype, "hidden_act": "silu", "attention_bias": model.add_qkv_bias,
    }


def model_config_from_hf(hf: dict, model_type_hf: Optional[str] = None) -> ModelConfig:
    """A ModelConfig from a HF config.json (Qwen2 or Llama family)."""
    heads = hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads") or heads
    arch = (hf.get("architectures") or [""])[0].lower()
    kind = model_type_hf or ("llama2" if "llama" in arch else "qwen25")
    head_dim = hf.get("head_dim")
    if head_dim and head_dim == hf["hidden_size"] // heads:
        head_dim = None
    cfg = ModelConfig(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"], ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=heads, max_position_embeddings=hf.get("max_position_embeddings", 4096),
        padded_vocab_size=hf["vocab_size"], make_vocab_size_divisible_by=1, kv_channels=head_dim,
        group_query_attention=kv != heads, num_query_groups=kv if kv != heads else None,
        rotary_base=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        normalization="RMSNorm", norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)), swiglu=True,
        add_qkv_bias=kind in ("qwen2", "qwen25") or bool(hf.get("attention_bias", False)),
        disable_bias_linear=True,
        untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", False),
        model_type_hf=kind)
    cfg.validate()
    return cfg


def _qkv_to_mcore(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    groups, d = cfg.kv_heads, cfg.head_dim
    per = cfg.num_attention_heads // groups
    tail = q.shape[1:]
    q = q.reshape(groups, per * d, *tail)
    k = k.reshape(groups, d, *tail)
    v = v.reshape(groups, d, *tail)
    return torch.cat([q, k, v], dim=1).reshape(-1, *tail)


def _qkv_from_mcore(qkv: torch.Tensor, cfg: ModelConfig):
    groups, d = cfg.kv_heads, cfg.head_dim
    per = cfg.num_attention_heads // groups
    tail = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per + 2) * d, *tail)
    q, k, v = torch.split(grouped, [per * d, d, d], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def hf_layer_names(i: int, cfg: ModelConfig) -> list:
    p = HF_LAYER.format(i=i)
    names = [p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
             p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
             p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
             p + "mlp.down_proj.weight"]
    if cfg.add_qkv_bias:
        names += [p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"]
    return names


def layer_hf_to_mcore(i: int, hf: Tensors, cfg: ModelConfig) -> Tensors:
    """Megatron weights of layer ``i`` (global numbering) from its HF tensors."""
    h, m = HF_LAYER.format(i=i), MG_LAYER.format(i=i)
    out = {
        m + "input_layernorm.weight": hf[h + "input_layernorm.weight"],
        m + "pre_mlp_layernorm.weight": hf[h + "post_attention_layernorm.weight"],
        m + "self_attention.linear_qkv.weight": _qkv_to_mcore(hf[h + "self_attn.q_proj.weight"],
                                                              hf[h + "self_attn.k_proj.weight"],
                                                              hf[h + "self_attn.v_proj.weight"], cfg),
        m + "self_attention.linear_proj.weight": hf[h + "self_attn.o_proj.weight"],
        m + "mlp.linear_fc1.weight": torch.cat([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]]),
        m + "mlp.linear_fc2.weight": hf[h + "mlp.down_proj.weight"],
    }
    if cfg.add_qkv_bias:
        out[m + "self_attention.linear_qkv.bias"] = _qkv_to_mcore(hf[h + "self_attn.q_proj.bias"],
                                                                  hf[h + "self_attn.k_proj.bias"],
                                                                  hf[h + "self_attn.v_proj.bias"], cfg)
    return out


def layer_mcore_to_hf(i: int, mg: Tensors, cfg: ModelConfig) -> Tensors:
    """HF tensors of layer ``i`` from its megatron weights (global numbering)."""
    h, m = HF_LAYER.format(i=i), MG_LAYER.format(i=i)
    q, k, v = _qkv_from_mcore(mg[m + "self_attention.linear_qkv.weight"], cfg)
    gate, up = mg[m + "mlp.linear_fc1.weight"].chunk(2, dim=0)
    out = {
        h + "input_layernorm.weight": mg[m + "input_layernorm.weight"],
        h + "post_attention_layernorm.weight": mg[m + "pre_mlp_layernorm.weight"],
        h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k, h + "self_attn.v_proj.weight": v,
        h + "self_attn.o_proj.weight": mg[m + "self_attention.linear_proj.weight"],
        h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
        h + "mlp.down_proj.weight": mg[m + "mlp.linear_fc2.weight"],
    }
    if cfg.add_qkv_bias:
        qb, kb, vb = _qkv_from_mcore(mg[m + "self_attention.linear_qkv.bias"], cfg)
        out.update({h + "self_attn.q_proj.bias": qb, h + "self_attn.k_proj.bias": kb, h + "self_attn.v_proj.bias": vb})
    return {k: v.contiguous() for k, v in out.items()}


def head_name_hf(orm: bool) -> str:
    return "score.weight" if orm else "lm_head.weight"


EMBED = ("model.embed_tokens.weight", "embedding.word_embeddings.weight")
FINAL_NORM = ("model.norm.weight", "decoder.final_layernorm.weight")
OUTPUT_MG = "output_layer.weight"
