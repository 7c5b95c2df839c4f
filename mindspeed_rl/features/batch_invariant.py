"""The zero-difference mode (generate_config.batch_invariant): rollout and training compute alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def check(cfg: PPOConfig) -> None:
    """The zero-difference mode: the megatron-core engine on both sides, packed forwards, one full copy's
    reductions (no TP or CP split), the same weights (no LoRA adapters computed apart)."""
    if not cfg.generate.batch_invariant:
        return
    actor, why = cfg.actor, "with generate_config.batch_invariant"
    if cfg.generate.backend != "fallback":
        raise ConfigError(
            "generate_config.backend",
            f"{cfg.generate.backend} {why}: only the megatron-core engine (fallback) computes as the trainer does; "
            "vLLM's kernels are its own (rollout/logprob_diff_* and logprob_exact_share measure how close they get)",
        )
    if not cfg.rl.use_remove_padding:
        raise ConfigError(
            "rl_config.use_remove_padding",
            f"false {why}: the padded attention path is not batch-invariant; set it true (packed forwards)",
        )
    for key, size in (
        ("tensor_model_parallel_size", actor.tp),
        ("context_parallel_size", actor.megatron.context_parallel_size),
    ):
        if size > 1:
            raise ConfigError(
                f"actor_config.{key}",
                f"{size} {why}: the rollout engine is one full copy, and a split changes the sums' order; use 1",
            )
    if actor.megatron.lora_r:
        raise ConfigError(
            "actor_config.lora_r",
            f"{actor.megatron.lora_r} {why}: the rollout's merged weights round otherwise "
            "than the adapters computed apart; use 0",
        )
