"""Recomputation and MindSpeed's memory switches of a role: the keys that need each other (device-independent; what
a device runs is checked before start, trainer/preflight.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import ConfigError
from .feature_rules import role_key
from .megatron_config import RECOMPUTE_MODULES

if TYPE_CHECKING:
    from .run_config import RoleConfig


def check_memory_switches(role: "RoleConfig") -> None:
    m = role.megatron
    if m.recompute_modules is not None:
        if m.recompute_granularity != "selective":
            raise ConfigError(role_key(role, "recompute_modules"), "needs recompute_granularity selective")
        unknown = [x for x in m.recompute_modules if x not in RECOMPUTE_MODULES]
        if unknown or not m.recompute_modules:
            raise ConfigError(
                role_key(role, "recompute_modules"),
                f"{unknown or 'empty'}: choose among {', '.join(RECOMPUTE_MODULES)}",
            )
        if "moe" in m.recompute_modules and not role.model.num_experts:
            raise ConfigError(role_key(role, "recompute_modules"), f"moe, but {m.model} has no experts")
    if m.recompute_norm and m.recompute_granularity == "full":
        raise ConfigError(
            role_key(role, "recompute_norm"),
            "with recompute_granularity full: whole layers (their norms too) are recomputed already",
        )
    for count, switch in (
        ("recompute_norm_num_layers", "recompute_norm"),
        ("recompute_activation_function_num_layers", "recompute_activation_function"),
    ):
        if getattr(m, count) and not getattr(m, switch):
            raise ConfigError(role_key(role, count), f"is set but {switch} is false")
    if m.reuse_fp32_param and not m.bf16:
        raise ConfigError(role_key(role, "reuse_fp32_param"), "needs bf16 (it shares bf16 weights with fp32 copies)")
    if m.reuse_fp32_param and m.swap_optimizer:
        raise ConfigError(role_key(role, "swap_optimizer"), "and reuse_fp32_param exclude each other: pick one")
    if m.swap_optimizer and not m.use_distributed_optimizer:
        raise ConfigError(
            role_key(role, "swap_optimizer"),
            "swaps the distributed optimizer's state: needs use_distributed_optimizer true",
        )
    if m.moe_hierarchical_alltoallv and not (role.model.num_experts and m.expert_model_parallel_size > 1):
        raise ConfigError(
            role_key(role, "moe_hierarchical_alltoallv"), "needs an MoE model split by expert_model_parallel_size > 1"
        )
