"""Partial rollout (rl_config.partial_rollout_max_split): a response grows in chunks across iterations; the
unfinished ones are parked and continued with the next weights."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def partial_chunk(max_tokens: int, max_split: int) -> int:
    """Tokens a trajectory grows per round under partial rollout: ceil(max_tokens / partial_rollout_max_split)."""
    return -(-max_tokens // max_split)


def check(cfg: PPOConfig) -> None:
    split, sampling = cfg.rl.partial_rollout_max_split, cfg.generate.sampling_config
    if split == 1:
        return
    if split > sampling.max_tokens:
        raise ConfigError(
            "rl_config.partial_rollout_max_split",
            f"{split} chunks of a {sampling.max_tokens}-token response would be empty: at most "
            "generate_config.sampling_config.max_tokens",
        )
    chunk = partial_chunk(sampling.max_tokens, split)
    if sampling.min_tokens > chunk:
        raise ConfigError(
            "generate_config.sampling_config.min_tokens",
            f"{sampling.min_tokens} is above the partial-rollout chunk of {chunk} tokens (max_tokens / "
            "partial_rollout_max_split)",
        )


def plan_lines(cfg: PPOConfig) -> List[str]:
    rl, split = cfg.rl, cfg.rl.partial_rollout_max_split
    if split == 1:
        return []
    return [
        f"  partial   : chunks of {partial_chunk(cfg.generate.sampling_config.max_tokens, split)} tokens "
        f"(max_tokens / partial_rollout_max_split {split}); unfinished responses are parked and continued "
        f"with the next weights, finished within {split} iterations"
        + ("" if rl.require_max_age_all_finished else " when rounds run (require_max_age_all_finished false)")
    ]
