"""Model families by name: everything that differs between Qwen2.5, Qwen3, Llama 3, Qwen3-MoE, DeepSeek-V3,
Qwen3-Next and the vision-language families.

    from mindspeed_rl.families import get_family, family_of_hf_config
    fam = get_family(model.model_type_hf)      # a name or one of its aliases ("qwen25", "qwen2", "llama2", ...)
    fam.layer_hf_to_mcore(i, tensors, model)   # weight maps; fam.hf_config(model, eos, pad) for vLLM

Adding a family: a module here with a :class:`ModelFamily` subclass registered in ``FAMILIES``,
its names in ``config_cls.model_config.FAMILY_NAMES``, a model yaml and its tests (docs/models.md).
"""

from __future__ import annotations

from typing import Dict, Optional

from .base import FamilyError, ModelFamily
from .deepseek_v3 import DeepseekV3
from .llama import Llama3
from .qwen2 import Qwen25
from .qwen2_5_vl import Qwen25VL
from .qwen3 import Qwen3
from .qwen3_5 import Qwen35, Qwen35Moe
from .qwen3_moe import Qwen3Moe
from .qwen3_next import Qwen3Next
from .qwen3_vl import Qwen3VL, Qwen3VLMoe

_ALL = (
    Qwen25(),
    Qwen3(),
    Llama3(),
    Qwen3Moe(),
    Qwen25VL(),
    Qwen3VL(),
    Qwen3VLMoe(),
    DeepseekV3(),
    Qwen3Next(),
    Qwen35(),
    Qwen35Moe(),
)
FAMILIES: Dict[str, ModelFamily] = {f.name: f for f in _ALL}
_BY_ALIAS: Dict[str, ModelFamily] = {alias: f for f in FAMILIES.values() for alias in (f.name,) + f.aliases}


def family_names() -> tuple:
    """Every accepted name: family names and their aliases."""
    return tuple(_BY_ALIAS)


def get_family(name: str) -> ModelFamily:
    try:
        return _BY_ALIAS[name.lower()]
    except KeyError:
        raise FamilyError(
            f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))} "
            f"(aliases: {', '.join(sorted(set(_BY_ALIAS) - set(FAMILIES)))})"
        ) from None


def family_of_hf_config(hf: dict, source: str = "config.json") -> ModelFamily:
    """The family of a HF config.json, from its ``model_type`` (or its architecture)."""
    model_type = str(hf.get("model_type") or "").lower()
    for family in FAMILIES.values():
        if model_type in family.hf_model_types:
            return family
    arch = (hf.get("architectures") or [""])[0]
    for family in FAMILIES.values():
        if arch and arch.replace("ForSequenceClassification", "ForCausalLM") == family.architecture:
            return family
    raise FamilyError(
        f"{source}: model_type {model_type or None!r} / architecture {arch or None!r} is not a "
        f"supported family ({', '.join(f'{f.name}: {f.hf_model_types[0]}' for f in FAMILIES.values())})"
    )


# MindSpeed-LLM converts Qwen2 / Qwen2.5 with ``--model-type-hf llama2 --add-qkv-bias`` ("a llama-like
# layer"): those spellings accept the families whose layer is Llama's plus a q/k/v bias
GENERIC_LLAMA = ("llama", "llama2")


def resolve_family(hf: dict, requested: Optional[str], source: str = "config.json") -> ModelFamily:
    """The family of ``hf``; a ``requested`` name must agree with it (MindSpeed-LLM's spellings accepted)."""
    found = family_of_hf_config(hf, source)
    if requested is not None:
        wanted = get_family(requested)
        if requested.lower() in GENERIC_LLAMA and found.name == "qwen25":
            return found
        if wanted is not found:
            raise FamilyError(
                f"--model-type-hf {requested} ({wanted.name}) contradicts {source}, which describes "
                f"a {found.name} model (model_type {hf.get('model_type')!r}); drop the flag to use "
                "what config.json says"
            )
    return found


__all__ = [
    "FAMILIES",
    "FamilyError",
    "ModelFamily",
    "family_names",
    "family_of_hf_config",
    "get_family",
    "resolve_family",
]
