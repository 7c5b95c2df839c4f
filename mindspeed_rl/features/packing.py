"""Packed sequences (use_remove_padding) and token-budget micro-batches (use_dynamic_bsz): single-stage models
only, and every budget holds the longest sequence; an unset budget is a forward or update micro-batch of the longest
sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def check(cfg: PPOConfig) -> None:
    """Remove padding and token-budget micro-batches: single-stage models only (pipeline stages exchange
    fixed shapes); every budget holds the longest sequence (derive fills in the defaults)."""
    rl = cfg.rl
    if not rl.use_dynamic_bsz:
        for key in ("ref_max_packing_token_size", "actor_max_packing_token_size", "update_max_packing_token_size"):
            if getattr(rl, key) is not None:
                raise ConfigError(f"rl_config.{key}", "is set but use_dynamic_bsz is false")
    if not (rl.use_remove_padding or rl.use_dynamic_bsz):
        return
    for role in cfg.roles:
        if role.pp > 1:
            key = "use_remove_padding" if rl.use_remove_padding else "use_dynamic_bsz"
            raise ConfigError(
                f"rl_config.{key}",
                f"needs pipeline_model_parallel_size 1; the {role.name} has PP "
                f"{role.pp} (stages exchange fixed-shape activations)",
            )
    if not rl.use_dynamic_bsz:
        return
    longest = rl.max_prompt_length + cfg.generate.sampling_config.max_tokens
    for key in ("ref_max_packing_token_size", "actor_max_packing_token_size", "update_max_packing_token_size"):
        value = getattr(rl, key)
        if value < longest:
            raise ConfigError(
                f"rl_config.{key}",
                f"{value} tokens cannot hold the longest sequence: "
                f"max_prompt_length {rl.max_prompt_length} + max_tokens "
                f"{cfg.generate.sampling_config.max_tokens} = {longest}",
            )


def derive(cfg: PPOConfig) -> None:
    """With use_dynamic_bsz, the unset budgets: the forward or update micro-batch x the longest sequence."""
    rl = cfg.rl
    if not rl.use_dynamic_bsz:
        return
    longest = rl.max_prompt_length + cfg.generate.sampling_config.max_tokens
    update_mbs = max(role.megatron.micro_batch_size for role in cfg.training_roles)
    defaults = {
        "ref_max_packing_token_size": rl.ref_forward_micro_batch_size * longest,
        "actor_max_packing_token_size": rl.actor_forward_micro_batch_size * longest,
        "update_max_packing_token_size": update_mbs * longest,
    }
    for key, default in defaults.items():
        if getattr(rl, key) is None:
            setattr(rl, key, default)
