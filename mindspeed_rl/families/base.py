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

from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import torch

from ..config_cls.model_config import ModelConfig

Tensors = Dict[str, torch.Tensor]
HF_LAYER = "model.layers.{i}."
MG_LAYER = "decoder.layers.{i}."
EMBED = ("model.embed_tokens.weight", "embedding.word_embeddings.weight")
FINAL_NORM = ("model.norm.weight", "decoder.final_layernorm.weight")
OUTPUT_MG = "output_layer.weight"
EXPERT_MG = "mlp.experts.local_experts.{e}."


class LayerNames(NamedTuple):
    renamed: List[Tuple[str, str]]  # (hf, megatron), one to one
    qkv: List[Tuple[Tuple[str, str, str], str]]  # ((q, k, v), linear_qkv) for weight [and bias]
    fc1: List[Tuple[Tuple[str, str], str]]  # ((gate, up), linear_fc1) per dense MLP or expert


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
    #: the function that builds the decoder block spec where the family's layers are not megatron-core's GPT layer
    #: (``module:function``, called as function(model, config, stage, transformer_engine) where the model is built);
    #: "": the GPT layer of models/builder.py
    layer_spec: str = ""
    #: (regular expression over a parameter's Megatron name, its TP layout: dim0, dim1 or replicate) for the family's
    #: own kinds of parameters, consulted after the norms, routers and standard projections (checkpoint/tp_split.py)
    tp_rules: Tuple[Tuple[str, str], ...] = ()

    # ------------------------------------------------------------------ configs
    def model_config_from_hf(self, hf: dict) -> ModelConfig:
        """The model section of a HF config.json of this family."""
        heads = hf["num_attention_heads"]
        kv = hf.get("num_key_value_heads") or heads
        head_dim = hf.get("head_dim")
        if head_dim and head_dim == hf["hidden_size"] // heads:
            head_dim = None
        values = dict(
            num_layers=hf["num_hidden_layers"],
            hidden_size=hf["hidden_size"],
            ffn_hidden_size=hf["intermediate_size"],
            num_attention_heads=heads,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            padded_vocab_size=hf["vocab_size"],
            make_vocab_size_divisible_by=1,
            kv_channels=head_dim,
            group_query_attention=kv != heads,
            num_query_groups=kv if kv != heads else None,
            rotary_base=float(rope_theta(hf)),
            normalization="RMSNorm",
            norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
            swiglu=True,
            add_qkv_bias=self.qkv_bias or bool(hf.get("attention_bias", False)),
            disable_bias_linear=True,
            qk_layernorm=self.qk_layernorm,
            untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", False),
            model_type_hf=self.name,
        )
        values.update(self.extra_model_fields(hf))
        cfg = ModelConfig(**values)
        cfg.check()
        return cfg

    def extra_model_fields(self, hf: dict) -> dict:
        """Family-specific model-section fields read from a HF config (rope scaling, experts)."""
        return {}

    def hf_config(self, model: ModelConfig, eos_token_id: int, pad_token_id: int, torch_dtype: str = "float32") -> dict:
        """The HF config.json of a model section: what vLLM loads and what save_hf / mcore -> hf write."""
        config = {
            "architectures": [self.architecture],
            "model_type": self.hf_model_types[0],
            "hidden_size": model.hidden_size,
            "intermediate_size": model.ffn_hidden_size,
            "num_hidden_layers": model.num_layers,
            "num_attention_heads": model.num_attention_heads,
            "num_key_value_heads": model.kv_heads,
            "head_dim": model.head_dim,
            "vocab_size": model.padded_vocab_size,
            "max_position_embeddings": model.max_position_embeddings,
            "rms_norm_eps": float(model.norm_epsilon),
            "rope_theta": float(model.rotary_base),
            "tie_word_embeddings": not model.untie_embeddings_and_output_weights,
            "eos_token_id": eos_token_id,
            "pad_token_id": pad_token_id,
            "bos_token_id": eos_token_id,
            "torch_dtype": torch_dtype,
            "hidden_act": "silu",
            "attention_bias": model.add_qkv_bias,
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
            raise ConfigError(
                f"{path}.num_experts", f"{self.name} is a dense family; use a MoE family (qwen3_moe) for experts"
            )
        if self.moe and not model.num_experts:
            raise ConfigError(f"{path}.num_experts", f"{self.name} is a mixture-of-experts family; set num_experts")

    # ------------------------------------------------------------------ parameter counts (families/parameters.py)
    def attention_parameters(self, model: ModelConfig) -> int:
        """One layer's attention and its norms: grouped-query attention (a family of another kind overrides it)."""
        h, d = model.hidden_size, model.head_dim
        q, kv = model.num_attention_heads * d, model.kv_heads * d
        bias = q + 2 * kv if model.add_qkv_bias else 0
        gate = h * q if model.attention_output_gate else 0
        return h * (q + 2 * kv) + gate + q * h + bias + (2 * d if model.qk_layernorm else 0)

    def linear_attention_parameters(self, model: ModelConfig) -> int:
        """One linear-attention layer, in the places ``model.is_linear_attention_layer`` names (none by default)."""
        return 0

    def vision_parameters(self, model: ModelConfig, part: str = "all") -> int:
        """A vision-language family's tower ("tower"), projector ("projector") or both ("all"); 0 for text."""
        return 0

    def vllm_head_dim(self, model: ModelConfig) -> int:
        """The head dimension vLLM's implementation of this family computes with."""
        return model.head_dim

    def vllm_unusable_reason(self, model: ModelConfig) -> Optional[str]:
        """Why vLLM's implementation of this family cannot run ``model`` (None when it can)."""
        return None

    def post_build(self, gpt, model: ModelConfig) -> None:
        """Adjust a built megatron GPTModel for what TransformerConfig cannot express (none by default)."""

    # ------------------------------------------------------------------ weights
    def hf_name_aliases(self, name: str) -> Tuple[str, ...]:
        """The names a tensor of the language model (``model.layers.{i}...``, ``model.embed_tokens``,
        ``lm_head``) may have in this family's HF checkpoints, the first found is read."""
        return (name,)

    #: what untrained_hf_names reads past, as the converters report it
    untrained_what = "multi-token-prediction layers"

    def untrained_hf_names(self, hf_names: Iterable[str], cfg: ModelConfig) -> List[str]:
        """Tensors of a HF folder this family reads past on purpose (DeepSeek's multi-token-prediction layers);
        the converters report how many."""
        return []

    def extra_hf_to_mcore(self, hf_names: Iterable[str]) -> Dict[str, str]:
        """HF name -> megatron name of the tensors outside the language model (a vision tower), which live on
        the first pipeline stage, replicated over TP; none by default."""
        return {}

    def extra_mcore_to_hf(self, name: str) -> Optional[str]:
        """The HF name of such a megatron tensor; None for the language model's own."""
        return None

    def hf_tensors_to_save(self, tensors: Tensors, cfg: ModelConfig) -> Tensors:
        """Language-model tensors (the maps' names) as this family's HF folders store them (as they are by default;
        a family whose checkpoints fuse tensors the maps keep apart fuses them here)."""
        return tensors

    def saved_hf_name(self, name: str) -> str:
        """The name a language-model tensor (``model.layers.{i}...``, ``model.embed_tokens``, ``lm_head``) is
        written under in this family's HF folders."""
        return name

    def layer_names(self, i: int, cfg: ModelConfig) -> LayerNames:
        """Layer ``i``'s names, each HF name with its megatron name (global layer and expert numbers):
        ``renamed`` tensors map one to one; ``qkv`` packs (q, k, v) per query group (weight, and bias with
        ``add_qkv_bias``); ``fc1`` is cat(gate, up). The three maps below all read this one table."""
        h, m = HF_LAYER.format(i=i), MG_LAYER.format(i=i)
        renamed = [
            (h + "input_layernorm.weight", m + "input_layernorm.weight"),
            (h + "post_attention_layernorm.weight", m + "pre_mlp_layernorm.weight"),
            (h + "self_attn.o_proj.weight", m + "self_attention.linear_proj.weight"),
        ]
        if cfg.qk_layernorm:
            renamed += [
                (h + "self_attn.q_norm.weight", m + "self_attention.q_layernorm.weight"),
                (h + "self_attn.k_norm.weight", m + "self_attention.k_layernorm.weight"),
            ]
        suffixes = ("weight", "bias") if cfg.add_qkv_bias else ("weight",)
        qkv = [
            (tuple(f"{h}self_attn.{x}_proj.{suffix}" for x in "qkv"), f"{m}self_attention.linear_qkv.{suffix}")
            for suffix in suffixes
        ]
        if cfg.num_experts:
            renamed.append((h + "mlp.gate.weight", m + "mlp.router.weight"))
            mlps = [(f"{h}mlp.experts.{e}.", m + EXPERT_MG.format(e=e)) for e in range(cfg.num_experts)]
        else:
            mlps = [(h + "mlp.", m + "mlp.")]
        fc1 = [((hp + "gate_proj.weight", hp + "up_proj.weight"), mp + "linear_fc1.weight") for hp, mp in mlps]
        renamed += [(hp + "down_proj.weight", mp + "linear_fc2.weight") for hp, mp in mlps]
        return LayerNames(renamed, qkv, fc1)

    def read_hf_layer(self, i: int, cfg: ModelConfig, reader) -> Tensors:
        """Layer ``i``'s HF tensors under the maps' names, from ``reader`` (``get(name)``, ``name in reader``)."""
        return {n: reader.get(n) for n in self.hf_layer_names(i, cfg)}

    def hf_layer_names(self, i: int, cfg: ModelConfig) -> List[str]:
        names = self.layer_names(i, cfg)
        return (
            [hf for hf, _ in names.renamed]
            + [n for triple, _ in names.qkv for n in triple]
            + [n for pair, _ in names.fc1 for n in pair]
        )

    def qkv_to_mcore(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        """megatron's linear_qkv from q_proj, k_proj and v_proj (a family with an output gate in q_proj overrides)."""
        return qkv_to_mcore(q, k, v, cfg)

    def qkv_from_mcore(self, qkv: torch.Tensor, cfg: ModelConfig):
        return qkv_from_mcore(qkv, cfg)

    def layer_hf_to_mcore(self, i: int, hf: Tensors, cfg: ModelConfig) -> Tensors:
        """Megatron weights of layer ``i`` (global layer and expert numbers) from its HF tensors."""
        names = self.layer_names(i, cfg)
        out = {mg: hf[name] for name, mg in names.renamed}
        out.update({mg: self.qkv_to_mcore(*(hf[n] for n in triple), cfg) for triple, mg in names.qkv})
        out.update({mg: torch.cat([hf[gate], hf[up]]) for (gate, up), mg in names.fc1})
        return out

    def layer_mcore_to_hf(self, i: int, mg: Tensors, cfg: ModelConfig) -> Tensors:
        """HF tensors of layer ``i`` from its megatron weights (global layer and expert numbers)."""
        names = self.layer_names(i, cfg)
        out = {name: mg[m] for name, m in names.renamed}
        for triple, m in names.qkv:
            out.update(zip(triple, self.qkv_from_mcore(mg[m], cfg)))
        for pair, m in names.fc1:
            out.update(zip(pair, mg[m].chunk(2, dim=0)))
        return {name: t.contiguous() for name, t in out.items()}


def moe_transformer_fields(model: ModelConfig) -> dict:
    """The TransformerConfig fields of a mixture-of-experts model that every family sets alike (each adds its
    router's own: score function, pre-softmax, load balancing, shared experts)."""
    return {
        "num_moe_experts": model.num_experts,
        "moe_router_topk": model.moe_router_topk,
        "moe_ffn_hidden_size": model.moe_ffn_hidden_size,
        "moe_aux_loss_coeff": model.moe_aux_loss_coeff,
        "moe_token_dispatcher_type": model.moe_token_dispatcher_type,
        "moe_grouped_gemm": False,  # the local spec's SequentialMLP (grouped GEMMs need TE)
        "moe_permute_fusion": False,
    }


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
