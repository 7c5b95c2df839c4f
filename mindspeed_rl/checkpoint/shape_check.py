"""A HF folder's config.json against its tensors, before hf -> mcore reads a weight or writes a file.

``check_hf_sizes``: the sizes config.json gives are possible (positive integers, heads dividing the hidden size when
no head_dim is given, key/value heads dividing the heads). ``check_tensor_shapes``: every tensor the converter reads
has the shape the config makes it, e.g. for a layer of a dense GQA model

    embed_tokens, lm_head   [vocab_size, hidden_size]        q_proj  [num_attention_heads x head_dim, hidden_size]
    k_proj, v_proj          [num_key_value_heads x head_dim, hidden_size]       o_proj  [hidden_size, heads x head_dim]
    gate_proj, up_proj      [intermediate_size, hidden_size]                    down_proj  the transpose

and MoE experts, routers and shared experts, MLA's low-rank projections, Gated DeltaNet's projections alike. A
disagreement names the config key (or the product of keys) and the tensor. A vision tower's tensors are not checked.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..config_cls.model_config import ModelConfig
from ..families.base import EMBED, FINAL_NORM, HF_LAYER, ModelFamily
from ..families.fused_experts import FusedExperts
from .errors import ConversionError

Shape = Tuple[int, ...]
POSITIVE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "vocab_size",
    "max_position_embeddings",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "full_attention_interval",
)
EXPERT_KEYS = (  # read by the mixture-of-experts families only
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
_LAYER = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.")
_EXPERT = re.compile(r"^mlp\.experts\.\d+\.")


def _sections(hf: dict) -> Iterator[Tuple[str, dict]]:
    """(key prefix, section) of the config's model fields: the top level, and ``text_config`` where nested."""
    yield "", hf
    if isinstance(hf.get("text_config"), dict):
        yield "text_config.", hf["text_config"]


def _text(hf: dict) -> Tuple[str, dict]:
    """The section the families read the language model from."""
    return ("text_config.", hf["text_config"]) if isinstance(hf.get("text_config"), dict) else ("", hf)


def check_hf_sizes(hf: dict, family: ModelFamily, path: str) -> None:
    """Refuse (ConversionError naming the key) a size of config.json no model can have."""
    keys = POSITIVE_KEYS + (EXPERT_KEYS if family.moe else ())
    for prefix, section in _sections(hf):
        for key in keys:
            value = section.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConversionError(f"{path}: {prefix}{key} is {value!r}; it must be a positive integer")
    prefix, text = _text(hf)
    hidden, heads, kv = text.get("hidden_size"), text.get("num_attention_heads"), text.get("num_key_value_heads")
    if hidden and heads and not text.get("head_dim") and hidden % heads:
        raise ConversionError(
            f"{path}: {prefix}num_attention_heads {heads} does not divide hidden_size {hidden} (and no head_dim is "
            "given)"
        )
    if heads and kv and heads % kv:
        raise ConversionError(f"{path}: {prefix}num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    key_heads, value_heads = text.get("linear_num_key_heads"), text.get("linear_num_value_heads")
    if key_heads and value_heads and value_heads % key_heads:
        raise ConversionError(
            f"{path}: {prefix}linear_num_value_heads {value_heads} is not a multiple of linear_num_key_heads "
            f"{key_heads}"
        )


class Dim:
    """A size and the config key(s) it follows from (``None``: any size)."""

    def __init__(self, size: Optional[int], key: str):
        self.size, self.key = size, key

    def __mul__(self, other: "Dim") -> "Dim":
        return Dim(self.size * other.size, f"{_grouped(self.key)} x {_grouped(other.key)}")

    def __add__(self, other: "Dim") -> "Dim":
        return Dim(self.size + other.size, f"{self.key} + {other.key}")


def _grouped(key: str) -> str:
    return f"({key})" if " + " in key else key


Rule = Sequence[Tuple[Dim, ...]]  # the shapes a tensor may have, the first as the message gives it


class Sizes:
    """The model's sizes as the converter reads them (``cfg``), each labelled with its config.json key."""

    def __init__(self, cfg: ModelConfig, hf: dict):
        prefix, text = _text(hf)
        key = lambda name: prefix + name  # noqa: E731
        self.h = Dim(cfg.hidden_size, key("hidden_size"))
        self.vocab = Dim(cfg.padded_vocab_size, key("vocab_size"))
        self.ffn = Dim(cfg.ffn_hidden_size, key("intermediate_size"))
        self.heads = Dim(cfg.num_attention_heads, key("num_attention_heads"))
        self.kv = Dim(
            cfg.kv_heads, key("num_key_value_heads" if text.get("num_key_value_heads") else "num_attention_heads")
        )
        self.d = Dim(cfg.head_dim, key("head_dim") if text.get("head_dim") else "hidden_size / num_attention_heads")
        experts = next(
            (k for k in ("num_experts", "num_local_experts", "n_routed_experts") if k in text), "num_experts"
        )
        self.experts = Dim(cfg.num_experts or 0, key(experts))
        self.expert_ffn = Dim(cfg.expert_ffn_hidden_size, key("moe_intermediate_size"))
        self.shared_ffn = (  # DeepSeek-V3: n_shared_experts experts' width; Qwen3-Next: its own key
            self.expert_ffn * Dim(cfg.n_shared_experts, key("n_shared_experts"))
            if cfg.n_shared_experts
            else Dim(cfg.moe_shared_expert_intermediate_size or 0, key("shared_expert_intermediate_size"))
        )
        self.q_rank = Dim(cfg.q_lora_rank or 0, key("q_lora_rank"))
        self.kv_rank = Dim(cfg.kv_lora_rank, key("kv_lora_rank"))
        self.nope = Dim(cfg.qk_head_dim, key("qk_nope_head_dim"))
        self.rope = Dim(cfg.qk_pos_emb_head_dim, key("qk_rope_head_dim"))
        self.v_head = Dim(cfg.v_head_dim, key("v_head_dim"))
        self.kernel = Dim(cfg.linear_conv_kernel_dim, key("linear_conv_kernel_dim"))
        self.key_heads = Dim(cfg.linear_num_key_heads, key("linear_num_key_heads"))
        self.value_heads = Dim(cfg.linear_num_value_heads, key("linear_num_value_heads"))
        self.key_dim = Dim(cfg.linear_key_head_dim, key("linear_key_head_dim"))
        self.value_dim = Dim(cfg.linear_value_head_dim, key("linear_value_head_dim"))


def _attention_rules(s: Sizes, cfg: ModelConfig) -> Dict[str, Rule]:
    h, heads = s.h, s.heads
    if cfg.multi_latent_attention:
        q_rows = heads * (s.nope + s.rope)
        rules = {
            "self_attn.q_proj.weight": (q_rows, h),
            "self_attn.q_a_proj.weight": (s.q_rank, h),
            "self_attn.q_a_layernorm.weight": (s.q_rank,),
            "self_attn.q_b_proj.weight": (q_rows, s.q_rank),
            "self_attn.kv_a_proj_with_mqa.weight": (s.kv_rank + s.rope, h),
            "self_attn.kv_a_layernorm.weight": (s.kv_rank,),
            "self_attn.kv_b_proj.weight": (heads * (s.nope + s.v_head), s.kv_rank),
            "self_attn.o_proj.weight": (h, heads * s.v_head),
        }
        return {name: [shape] for name, shape in rules.items()}
    q, kv = heads * s.d, s.kv * s.d
    gated = Dim(2, "2") * q if cfg.attention_output_gate else q  # q_proj also gives each head its output gate
    rules = {
        "self_attn.q_proj.weight": (gated, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.q_proj.bias": (q,),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (h, q),
        "self_attn.q_norm.weight": (s.d,),
        "self_attn.k_norm.weight": (s.d,),
    }
    return {name: [shape] for name, shape in rules.items()}


def _linear_attention_rules(s: Sizes) -> Dict[str, Rule]:
    """Gated DeltaNet (Qwen3-Next's fused input projections, Qwen3.5's separate ones)."""
    h, value_heads = s.h, s.value_heads
    key, value = s.key_heads * s.key_dim, value_heads * s.value_dim
    two = Dim(2, "2")
    conv = two * key + value
    rules = {
        "in_proj_qkvz.weight": (two * key + two * value, h),
        "in_proj_ba.weight": (two * value_heads, h),
        "in_proj_qkv.weight": (conv, h),
        "in_proj_z.weight": (value, h),
        "in_proj_b.weight": (value_heads, h),
        "in_proj_a.weight": (value_heads, h),
        "conv1d.weight": (conv, Dim(1, "1"), s.kernel),
        "dt_bias": (value_heads,),
        "A_log": (value_heads,),
        "norm.weight": (s.value_dim,),
        "out_proj.weight": (h, value),
    }
    return {"linear_attn." + name: [shape] for name, shape in rules.items()}


def _mlp_rules(s: Sizes) -> Dict[str, Rule]:
    h, e, f = s.h, s.experts, s.expert_ffn
    rules: Dict[str, Rule] = {}
    widths = {
        "mlp.": s.ffn,
        "mlp.experts.E.": f,
        "mlp.shared_experts.": s.shared_ffn,
        "mlp.shared_expert.": s.shared_ffn,
    }
    for prefix, inner in widths.items():
        rules.update({prefix + "gate_proj.weight": [(inner, h)], prefix + "up_proj.weight": [(inner, h)]})
        rules[prefix + "down_proj.weight"] = [(h, inner)]
    two_f = Dim(2, "2") * f
    rules.update(
        {
            "mlp.gate.weight": [(e, h)],
            "mlp.gate.e_score_correction_bias": [(e,)],
            "mlp.shared_expert_gate.weight": [(Dim(1, "1"), h)],
            "mlp.experts.gate_up_proj": [(e, two_f, h), (e, h, two_f)],  # fused experts, either orientation
            "mlp.experts.down_proj": [(e, h, f), (e, f, h)],
        }
    )
    return rules


def tensor_rules(cfg: ModelConfig, hf: dict) -> Dict[str, Rule]:
    """The shapes of the tensors: the language model's outside the layers by name, a layer's by its name within the
    layer (``mlp.experts.E.``: any expert)."""
    s = Sizes(cfg, hf)
    rules: Dict[str, Rule] = {
        EMBED[0]: [(s.vocab, s.h)],
        "lm_head.weight": [(s.vocab, s.h)],
        FINAL_NORM[0]: [(s.h,)],
        "score.weight": [(Dim(None, "num_labels"), s.h)],  # one label (--orm): checked with its own message
        "input_layernorm.weight": [(s.h,)],
        "post_attention_layernorm.weight": [(s.h,)],
    }
    return {**rules, **_attention_rules(s, cfg), **_linear_attention_rules(s), **_mlp_rules(s)}


def read_names(family: ModelFamily, cfg: ModelConfig, present: Callable[[str], bool], orm: bool) -> List[str]:
    """The language-model tensors hf -> mcore reads, in its order (a fused-experts folder's fused tensors in the place
    of the per-expert names)."""
    names = [EMBED[0]]
    for i in range(cfg.num_layers):
        layer = family.hf_layer_names(i, cfg)
        fused = HF_LAYER.format(i=i) + "mlp.experts."
        if isinstance(family, FusedExperts) and present(fused + "gate_up_proj"):
            per_expert = set(family.expert_names(i, cfg))
            layer = [n for n in layer if n not in per_expert] + [fused + "gate_up_proj", fused + "down_proj"]
        names += layer
    names.append(FINAL_NORM[0])
    if orm and present("score.weight"):
        names.append("score.weight")
    elif cfg.untie_embeddings_and_output_weights and not orm:
        names.append("lm_head.weight")
    return names


def rule_for(name: str, rules: Dict[str, Rule]) -> Optional[Rule]:
    match = _LAYER.match(name)
    return rules.get(_EXPERT.sub("mlp.experts.E.", name[match.end() :]) if match else name)


def _key(hf: dict, name: str) -> str:
    return _text(hf)[0] + name


def _fits(shape: Shape, dims: Tuple[Dim, ...]) -> bool:
    return len(shape) == len(dims) and all(d.size is None or d.size == n for d, n in zip(dims, shape))


def _disagreement(path: str, name: str, shape: Shape, rule: Rule) -> ConversionError:
    dims = rule[0]
    if len(shape) != len(dims):
        what = f"{len(dims)} dimensions ({', '.join(d.key for d in dims)})"
    else:
        wrong = next(d for d, n in zip(dims, shape) if d.size is not None and d.size != n)
        what = f"{wrong.key} = {wrong.size}"
    expected = ", ".join("*" if d.size is None else str(d.size) for d in dims)
    return ConversionError(
        f"{path}: {what} disagrees with tensor {name} of shape {list(shape)} (the config makes it [{expected}]: "
        f"{', '.join(d.key for d in dims)})"
    )


def check_tensor_shapes(
    family: ModelFamily, cfg: ModelConfig, hf: dict, reader, stored: Callable[[str], str], orm: bool
) -> None:
    """Refuse (ConversionError naming the key and the tensor) a HF folder (``reader``: its ``HFReader``; ``hf``: its
    config.json) whose tensors are not what the config makes them: a tensor the converter reads that is missing or of
    another shape, or a decoder layer past ``num_hidden_layers`` that the family does not read past on purpose.
    ``stored``: the name a tensor is stored under (a family's aliases)."""
    shapes, path = reader.shapes(), os.path.join(reader.folder, "config.json")
    rules = tensor_rules(cfg, hf)
    for name in read_names(family, cfg, lambda n: stored(n) in shapes, orm):
        if stored(name) not in shapes:
            raise ConversionError(f"{reader.folder}: tensor {name!r} not found (the model {path} gives has it)")
        rule = rule_for(name, rules)
        shape = shapes[stored(name)]
        if rule is not None and not any(_fits(shape, dims) for dims in rule):
            raise _disagreement(path, name, shape, rule)
    skipped = set(family.untrained_hf_names(shapes, cfg))
    beyond = [n for n in shapes if n not in skipped and (m := _LAYER.match(n)) and int(m.group(1)) >= cfg.num_layers]
    if beyond:
        raise ConversionError(
            f"{path}: {_key(hf, 'num_hidden_layers')} = {cfg.num_layers} disagrees with tensor {beyond[0]} (a layer "
            "past the last the config gives)"
        )
