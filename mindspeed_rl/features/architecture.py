"""Features a model's architecture does not run with here: multi-latent attention (DeepSeek-V3) or Gated DeltaNet
layers (Qwen3-Next) with LoRA (our adapters wrap the q/k/v and MLP layers of the standard attention) or with context
parallelism (our Ulysses and the ring wrap the standard attention's core; a Gated DeltaNet state runs along the whole
sequence); Gated DeltaNet's key heads split whole over TP."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from ..config_cls.run_config import role_key
from ..utils.cli import UserError

if TYPE_CHECKING:
    from ..config_cls.model_config import ModelConfig
    from ..config_cls.run_config import PPOConfig, RoleConfig


def check_role(role: "RoleConfig") -> None:
    m, model = role.megatron, role.model
    if model.linear_attention_freq:
        _check_linear_attention(role)
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


def _check_linear_attention(role: "RoleConfig") -> None:
    m, model = role.megatron, role.model
    if m.lora_r:
        raise ConfigError(
            role_key(role, "lora_r"),
            f"{m.lora_r} on {m.model}: LoRA adapts the standard attention's linear_qkv, which Gated DeltaNet layers do "
            "not have; train it in full (lora_r 0)",
        )
    if role.cp > 1:
        raise ConfigError(
            role_key(role, "context_parallel_size"),
            f"{role.cp} on {m.model}: Gated DeltaNet carries a state along the whole sequence, which context "
            "parallelism would split; use context_parallel_size 1",
        )
    if model.linear_num_key_heads % role.tp:
        raise ConfigError(
            role_key(role, "tensor_model_parallel_size"),
            f"{role.tp} does not divide {m.model}'s linear_num_key_heads {model.linear_num_key_heads} (a rank holds "
            "whole Gated DeltaNet key heads)",
        )


def check_infer_heads(model: "ModelConfig", itp: int) -> None:
    """vLLM at infer TP ``itp`` splits the query heads (and Gated DeltaNet's key and value heads) evenly; a query group
    is split too, or replicated on itp / groups ranks when there are fewer groups than ranks."""
    key = "generate_config.infer_tensor_parallel_size"
    heads, groups = model.num_attention_heads, model.kv_heads
    if heads % itp or (groups % itp and itp % groups):
        raise ConfigError(
            key,
            f"{itp} does not divide the heads ({heads}) of the actor's model, or neither divides nor is a multiple of "
            f"its query groups ({groups})",
        )
    linear = (model.linear_num_key_heads, model.linear_num_value_heads) if model.linear_attention_freq else ()
    if any(n % itp for n in linear):
        raise ConfigError(key, f"{itp} does not divide the Gated DeltaNet key and value heads {linear}")


def check(cfg: PPOConfig) -> None:
    check_infer_heads(cfg.actor.model, cfg.generate.infer_tensor_parallel_size)


def preflight(cfg: PPOConfig, accelerator) -> None:
    """Qwen3-Next's Gated DeltaNet layers exist in the installed megatron-core."""
    from ..compat.megatron_core import gated_delta_net_unavailable

    for role in cfg.roles:
        if role.model.linear_attention_freq and gated_delta_net_unavailable():
            raise UserError(f"{role_key(role, 'model')}: {role.megatron.model}: {gated_delta_net_unavailable()}")
