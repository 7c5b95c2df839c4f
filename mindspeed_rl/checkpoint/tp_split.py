"""Split full megatron-core (local spec) weights into tensor-parallel shards and merge them back.

Rules: qkv, word embeddings, output layer and their biases chunk on dim 0 (whole
query groups per rank, because megatron stores qkv grouped as [q of the group's heads; k; v]);
linear_fc1 of a SwiGLU MLP is cat(gate, up), so rank r holds cat(gate chunk r, up chunk r);
linear_proj and linear_fc2 chunk on dim 1; norms are replicated. A family's own kinds of parameters follow its
``tp_rules`` (multi-latent attention's projections column-parallel: families/deepseek_v3.py; Gated DeltaNet's whole
key-head groups per rank: families/qwen3_next.py). A value head
(``output_layer.weight`` with one row) is replicated. LoRA adapters (``<layer>.lora_A`` / ``lora_B``):
on column-parallel layers A is replicated and B split like the weight's rows; on row-parallel layers A
is split like the weight's columns and B replicated. A vision tower (``visual.*``) is replicated.
"""

from __future__ import annotations

import functools
import re
from typing import Dict, List, Sequence, Tuple

import torch

_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


@functools.lru_cache(maxsize=None)
def family_rules() -> Tuple[Tuple["re.Pattern[str]", str], ...]:
    """Every family's rules for its own kinds of parameters (``ModelFamily.tp_rules``): their names are the kind's
    alone, so one list serves every model."""
    from ..families import FAMILIES

    rules = {(pattern, rule) for family in FAMILIES.values() for pattern, rule in family.tp_rules}
    return tuple((re.compile(pattern), rule) for pattern, rule in sorted(rules))


def tp_rule(name: str, shape: Sequence[int], swiglu: bool = True) -> str:
    """How parameter ``name`` is laid out across TP ranks: replicate | dim0 | dim1 | swiglu."""
    if name.endswith("_extra_state") or name.startswith("visual."):
        return "replicate"  # a vision tower is replicated over TP (families/vision)
    if name.endswith((".lora_A", ".lora_B")):  # LoRA: the split side follows the layer's weight
        layer, adapter = name.rsplit(".", 1)
        column = "linear_qkv" in layer or "linear_fc1" in layer
        if column:
            return "replicate" if adapter == "lora_A" else tp_rule(layer + ".weight", shape, swiglu)
        return "dim1" if adapter == "lora_A" else "replicate"
    if "layernorm" in name or name.endswith("norm.weight") or name.endswith("norm.bias"):
        return "replicate"
    if name.endswith(("mlp.router.weight", "mlp.router.bias", "mlp.router.expert_bias", "shared_experts.gate_weight")):
        return "replicate"
    if name.startswith("output_layer.") and len(shape) == 2 and shape[0] == 1:
        return "replicate"  # value head: hidden -> 1
    if "linear_fc1" in name:
        return "swiglu" if swiglu else "dim0"
    if "linear_qkv" in name or "word_embeddings" in name or name.startswith("output_layer."):
        return "dim0"
    for pattern, rule in family_rules():  # multi-latent attention, Gated DeltaNet, ...
        if pattern.search(name):
            return rule
    if ("linear_proj" in name or "linear_fc2" in name) and name.endswith("weight"):
        return "dim1"
    if "linear_proj" in name or "linear_fc2" in name:
        return "replicate"  # row-parallel bias is added after the reduce
    raise KeyError(f"no tensor-parallel rule for parameter {name!r}")


def split_tp(name: str, full: torch.Tensor, tp: int, rank: int, swiglu: bool = True) -> torch.Tensor:
    """Rank ``rank``'s shard of the full tensor ``full``."""
    rule = tp_rule(name, full.shape, swiglu)
    if tp == 1 or rule == "replicate":
        return full
    if rule == "dim0":
        return full.chunk(tp, dim=0)[rank]
    if rule == "dim1":
        return full.chunk(tp, dim=1)[rank]
    gate, up = full.chunk(2, dim=0)
    return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]], dim=0)


def merge_tp(name: str, shards: List[torch.Tensor], swiglu: bool = True) -> torch.Tensor:
    """The full tensor from the shards of every TP rank, in rank order."""
    rule = tp_rule(name, shards[0].shape, swiglu)
    if len(shards) == 1 or rule == "replicate":
        return shards[0]
    if rule == "dim0":
        return torch.cat(shards, dim=0)
    if rule == "dim1":
        return torch.cat(shards, dim=1)
    gates, ups = zip(*(s.chunk(2, dim=0) for s in shards))
    return torch.cat(list(gates) + list(ups), dim=0)


def layer_number(name: str) -> int:
    """Layer index in a parameter name (-1 when it has none)."""
    m = _LAYER.search(name)
    return int(m.group(2)) if m else -1


def shift_layer(name: str, offset: int) -> str:
    """Renumber the layer index in ``name`` by ``offset`` (PP stages number their layers from 0)."""
    m = _LAYER.search(name)
    if not m:
        return name
    return name[: m.start(2)] + str(int(m.group(2)) + offset) + name[m.end(2) :]


def expert_number(name: str) -> int:
    """Expert index in a parameter name (-1 when it is not an expert's)."""
    m = _EXPERT.search(name)
    return int(m.group(1)) if m else -1


def renumber_expert(name: str, expert: int) -> str:
    m = _EXPERT.search(name)
    return name[: m.start(1)] + str(expert) + name[m.end(1) :]


def ep_owner(expert: int, num_experts: int, ep: int):
    """(EP rank, local expert number) holding global expert ``expert``."""
    per = num_experts // ep
    return expert // per, expert % per


def merge(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + scaling * B A in fp32, returned in W's dtype (a rank's shards line up for both layer kinds)."""
    return (weight.float() + scaling * (b.float() @ a.float())).to(weight.dtype)


def fold_lora(weights: Dict[str, torch.Tensor], scaling: float) -> Dict[str, torch.Tensor]:
    """Full weights with every ``<layer>.lora_A`` / ``lora_B`` pair merged into ``<layer>.weight``:
    W + scaling * B A (the adapters themselves dropped)."""
    out = {n: t for n, t in weights.items() if not n.endswith((".lora_A", ".lora_B"))}
    for name in weights:
        if name.endswith(".lora_A"):
            layer = name[: -len(".lora_A")]
            out[layer + ".weight"] = merge(out[layer + ".weight"], weights[name], weights[layer + ".lora_B"], scaling)
    return out
