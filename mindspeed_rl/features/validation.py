"""Validation on the held-out set (rl_config.test_freq): its data, its scoring, and the plan's line when a test set is
configured but validation is off."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


# what the batch plans say when a test set is configured but validation is off: one key switches it off
VALIDATION_OFF = "off (rl_config.test_freq 0): test_data_path {path!r} is not read, val_before_train does nothing"


def validates(cfg: PPOConfig) -> bool:
    """Validation is on: rl_config.test_freq > 0 (then also before training with val_before_train)."""
    return cfg.rl.test_freq > 0


def check(cfg: PPOConfig) -> None:
    rl, test = cfg.rl, cfg.actor.megatron.test_data_path
    if validates(cfg) and not test:
        raise ConfigError(
            "megatron_training.test_data_path", "required by rl_config.test_freq: the preprocessed test set"
        )
    if validates(cfg) and not rl.rule_reward:
        raise ConfigError("rl_config.test_freq", "validation scores with the rule verifiers: rule_reward must be true")


def plan_lines(cfg: PPOConfig) -> List[str]:
    test = cfg.actor.megatron.test_data_path
    return [f"  validation: {VALIDATION_OFF.format(path=test)}"] if test and not validates(cfg) else []
