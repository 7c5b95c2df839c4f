"""Asynchronous rollout (rl_config.max_head_offpolicyness L): rollout workers of their own generate up to L batches
ahead of training."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


MAX_HEAD_OFFPOLICYNESS = 8
"""The most batches asynchronous rollout may generate ahead (docs/rollout.md): the L + 1 batches in flight are
held by the driver, waited for and stored by every checkpoint, and the first weight push queues behind L of
them."""


def check_async_lag(lag: int, train_iters: int) -> None:
    """max_head_offpolicyness L: the first iteration submits L + 1 batches, which must be batches of the run
    (L < train_iters) and few enough to hold (L <= MAX_HEAD_OFFPOLICYNESS)."""
    if lag > MAX_HEAD_OFFPOLICYNESS:
        raise ConfigError(
            "rl_config.max_head_offpolicyness",
            f"{lag} is above {MAX_HEAD_OFFPOLICYNESS}: the rollout workers would generate {lag + 1} batches before "
            "the first weight update reaches them, and every checkpoint waits for and stores all of them "
            "(AReaL's examples use 2 to 4)",
        )
    if lag >= train_iters:
        raise ConfigError(
            "rl_config.max_head_offpolicyness",
            f"{lag} is not below megatron_training.train_iters {train_iters}: the first iteration would submit "
            f"{lag + 1} batches, more than the run's {train_iters} iterations train on: at most {train_iters - 1}",
        )


def check(cfg: PPOConfig) -> None:
    rl = cfg.rl
    if rl.max_head_offpolicyness == 0:
        return
    if rl.rollout_resource is None:
        raise ConfigError(
            "rl_config.max_head_offpolicyness",
            "asynchronous rollout needs rollout workers of their own: set rl_config.rollout_resource",
        )
    check_async_lag(rl.max_head_offpolicyness, cfg.megatron_training.train_iters)


def plan_lines(cfg: PPOConfig) -> List[str]:
    lag = cfg.rl.max_head_offpolicyness
    if lag == 0:
        return []
    return [
        f"  async     : the rollout workers generate up to {lag} batch(es) ahead of training (each sampled at most "
        "that many versions before it trains)"
    ]
