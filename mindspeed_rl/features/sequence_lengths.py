"""Sequence lengths: prompt + response fits training's seq_length, the engine's max_model_len and the model's
positions, and one prompt fits the engine's token budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def check(cfg: PPOConfig) -> None:
    """Prompt + response fits training's seq_length, the engine's max_model_len and the model's positions."""
    rl, gen = cfg.rl, cfg.generate
    seq_length = cfg.megatron_training.seq_length
    if seq_length is not None and rl.max_prompt_length > seq_length:
        raise ConfigError(
            "rl_config.max_prompt_length", f"{rl.max_prompt_length} exceeds megatron_training.seq_length {seq_length}"
        )
    needed = rl.max_prompt_length + gen.sampling_config.max_tokens
    if seq_length is not None and needed > seq_length:
        raise ConfigError(
            "megatron_training.seq_length",
            f"{seq_length} is below rl_config.max_prompt_length + sampling_config.max_tokens = {needed}, "
            "the longest sequence training sees",
        )
    if needed > gen.max_model_len:
        raise ConfigError(
            "generate_config.max_model_len",
            f"{gen.max_model_len} is below rl_config.max_prompt_length + sampling_config.max_tokens = {needed}",
        )
    positions = cfg.actor.model.max_position_embeddings
    if positions is not None and gen.max_model_len > positions:
        raise ConfigError(
            "generate_config.max_model_len",
            f"{gen.max_model_len} exceeds the actor model's max_position_embeddings {positions}: "
            "vLLM refuses it (lower max_model_len)",
        )
    if gen.max_num_batched_tokens < gen.max_model_len and gen.max_num_batched_tokens < rl.max_prompt_length:
        raise ConfigError(
            "generate_config.max_num_batched_tokens",
            f"{gen.max_num_batched_tokens} cannot hold one prompt of max_prompt_length {rl.max_prompt_length}",
        )
