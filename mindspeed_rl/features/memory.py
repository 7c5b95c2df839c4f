"""Recomputation and MindSpeed's memory switches of a role: the keys that need each other (device-independent; what
a device runs: preflight)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from ..config_cls.megatron_config import MINDSPEED_SWITCHES, RECOMPUTE_MODULES
from ..config_cls.run_config import role_key
from ..utils.cli import UserError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig


def check_role(role: "RoleConfig") -> None:
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


def check_mindspeed_switches(role: RoleConfig, accelerator) -> None:
    """MindSpeed's switches run where MindSpeed does (NPU), each if the installed release defines its flag;
    elsewhere recompute_norm is megatron-core's layernorm recomputation and the others are refused, naming the key."""
    from ..compat import mindspeed

    version = mindspeed.installed_version() if accelerator.runs_mindspeed else None
    for key, flag in MINDSPEED_SWITCHES.items():
        if not getattr(role.megatron, key) or (key == "recompute_norm" and not accelerator.runs_mindspeed):
            continue
        if accelerator.runs_mindspeed:
            reason = mindspeed.flag_unavailable(flag, version)
        else:
            reason = f"nothing implements it on {accelerator.kind} (MindSpeed patches megatron-core on NPU)"
            if key.startswith("recompute"):
                reason += "; megatron-core recomputes layers or modules: recompute_granularity / recompute_modules"
        if reason:
            raise UserError(f"{role_key(role, key)}: a MindSpeed switch (docs/features.md); {reason}; remove it")


def preflight(cfg: PPOConfig, accelerator) -> None:
    for role in cfg.roles:
        check_mindspeed_switches(role, accelerator)
