"""Features a model's architecture does not run with here: multi-latent attention (DeepSeek-V3) with LoRA (our
adapters wrap the q/k/v and MLP layers of the standard attention) or with context parallelism (our Ulysses and
the ring wrap that attention's core, not MLA's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import ConfigError
from .feature_rules import role_key

if TYPE_CHECKING:
    from .ppo_config import RoleConfig


def check_architecture_features(role: "RoleConfig") -> None:
    m, model = role.megatron, role.model
    if not model.multi_latent_attention:
        return
    if m.lora_r:
        raise ConfigError(
            role_key(role, "lora_r"),
            f"{m.lora_r} on {m.model}: LoRA adapts the standard attention's linear_qkv, which multi-latent "
            "attention does not have; train it in full (lora_r 0)",
        )
    if role.cp > 1:
        raise ConfigError(
            role_key(role, "context_parallel_size"),
            f"{role.cp} on {m.model}: context parallelism wraps the standard attention's core, not multi-latent "
            "attention's; use context_parallel_size 1",
        )
