"""Context parallelism: Ulysses splits the attention heads over CP ranks (the heads and query groups of a TP rank
must allow it); ring attention (megatron_cp_algo) needs a device that has it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..accelerator import accelerator_class
from ..config_cls.base import ConfigError
from ..config_cls.run_config import role_key
from ..utils.cli import UserError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig


def ulysses_layout(heads: int, groups: int, cp: int) -> Optional[str]:
    """Why Ulysses cannot split ``heads`` query heads and ``groups`` key/value groups (per TP rank) over CP
    ranks, or None when it can. Key/value groups fewer than CP are repeated (each rank needs one)."""
    if heads % cp:
        return f"{heads} attention heads per TP rank do not split over CP {cp}"
    if groups % cp and cp % groups:
        return f"{groups} query groups per TP rank neither split over CP {cp} nor divide it"
    return None


def check_role(role: RoleConfig) -> None:
    """Ulysses splits the attention heads over CP: the heads and query groups of a TP rank must allow it."""
    m, model = role.megatron, role.model
    if role.cp > 1 and m.context_parallel_algo == "megatron_cp_algo" and m.lora_r:
        raise ConfigError(
            role_key(role, "context_parallel_algo"),
            "megatron_cp_algo is Transformer Engine's ring attention, and LoRA trains on the local layer spec "
            "without it: use ulysses_cp_algo with lora_r",
        )
    if role.cp == 1 or m.context_parallel_algo != "ulysses_cp_algo":
        return
    if model.num_attention_heads % role.tp or model.kv_heads % role.tp:
        return  # the TP rule names it
    reason = ulysses_layout(model.num_attention_heads // role.tp, model.kv_heads // role.tp, role.cp)
    if reason:
        raise ConfigError(
            role_key(role, "context_parallel_size"),
            f"{role.cp} with ulysses_cp_algo: {reason} (model {m.model}: {model.num_attention_heads} heads, "
            f"{model.kv_heads} query groups, TP {role.tp}); choose a CP size that fits or megatron_cp_algo",
        )


def ring_attention_unavailable(megatron, kind: str) -> Optional[str]:
    """Why ``megatron_cp_algo`` (ring attention) cannot run on device ``kind``, or None (also when not asked)."""
    if megatron.context_parallel_size == 1 or megatron.context_parallel_algo != "megatron_cp_algo":
        return None
    if accelerator_class(kind).fused_features()["ring_attention"]:
        return None
    return (
        f"megatron_cp_algo (ring attention) needs Transformer Engine on CUDA or MindSpeed on NPU; this is {kind}: "
        "use ulysses_cp_algo"
    )


def preflight(cfg: PPOConfig, accelerator) -> None:
    for role in cfg.roles:
        reason = ring_attention_unavailable(role.megatron, accelerator.kind)
        if reason:
            raise UserError(f"{role_key(role, 'context_parallel_algo')}: {reason}")
