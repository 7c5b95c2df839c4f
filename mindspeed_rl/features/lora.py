"""LoRA (a role's lora_r, lora_target_modules): adapters on the named layers of a training role, a rank no larger
than the layer it adapts; with it the reference is the actor's own base weights (adapters off)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from ..config_cls.run_config import role_key

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig


LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def check_targets(role: RoleConfig) -> None:
    """Each target is a layer LoRA adapts, and lora_r > 0 names at least one."""
    m = role.megatron
    unknown = [t for t in m.lora_target_modules if t not in LORA_TARGETS]
    if unknown or (m.lora_r and not m.lora_target_modules):
        raise ConfigError(
            role_key(role, "lora_target_modules"), f"{unknown or 'empty'}: choose among {', '.join(LORA_TARGETS)}"
        )


def check(cfg: PPOConfig) -> None:
    """A frozen reward model or teacher ignores lora_r; the actor's adapters exclude another reference folder."""
    for role in cfg.roles:
        check_targets(role)
    for role in cfg.training_roles:
        check_rank(role)
    if cfg.actor.megatron.lora_r and cfg.rl.integrated_mode_config.ref_model_load_path:
        raise ConfigError(
            "rl_config.integrated_mode_config.ref_model_load_path",
            "with actor_config.lora_r > 0 the reference is the actor's base weights (adapters off); remove it",
        )


def check_rank(role: RoleConfig) -> None:
    """An adapter's rank above min(in, out) of the full weight it adapts adds parameters and no expressive
    power (B A already has full rank at min(in, out)); the tightest target layer names the bound."""
    m = role.megatron
    if not m.lora_r:
        return
    shapes = role.model.lora_layer_shapes()
    targets = [t for t in m.lora_target_modules if t in shapes]
    if not targets:
        return
    name = min(targets, key=lambda t: min(shapes[t][1:3]))
    _, fan_in, fan_out, experts = shapes[name]
    bound = min(fan_in, fan_out)
    if m.lora_r > bound:
        layer = f"{name} of each expert" if experts else name
        raise ConfigError(
            f"{role.name}_config.lora_r",
            f"{m.lora_r} exceeds the smaller dimension of {layer} in model {m.model} (weight [out {fan_out}, "
            f"in {fan_in}], un-sharded): the rank must be at most {bound}",
        )
