"""Asynchronous rollout (rl_config.max_head_offpolicyness L): rollout workers of their own generate up to L batches
ahead of training; with rl_config.async_training.in_flight_weight_updates the new weights reach them while their
requests are in flight (fully asynchronous), and a staleness bound drops or regenerates what is too old."""

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


def staleness_cap(rl) -> int:
    """The most policy versions a trained token can lag where no finished group waits: L batches produced ahead,
    k - 1 updates not pushed yet (update_weights_interval k), and max_split - 1 iterations parked (partial rollout)."""
    return rl.max_head_offpolicyness + rl.async_training.update_weights_interval - 1 + rl.partial_rollout_max_split - 1


def _key(name: str) -> str:
    return f"rl_config.async_training.{name}"


def check_in_flight(cfg: PPOConfig) -> None:
    """The rules of rl_config.async_training's keys."""
    rl, keys = cfg.rl, cfg.rl.async_training
    lag, interval = rl.max_head_offpolicyness, keys.update_weights_interval
    needs_lag = [
        name
        for name, on in (
            ("in_flight_weight_updates", keys.in_flight_weight_updates),
            ("max_staleness", keys.max_staleness is not None),
        )
        if on
    ]
    if needs_lag and lag == 0:
        raise ConfigError(
            _key(needs_lag[0]),
            "applies to asynchronous rollout: set rl_config.max_head_offpolicyness >= 1 (and rollout_resource)",
        )
    cap = staleness_cap(rl)
    if keys.max_staleness is not None and keys.max_staleness > cap:
        raise ConfigError(
            _key("max_staleness"),
            f"{keys.max_staleness} is above {cap}, the most a token can lag with the buffer of "
            f"max_head_offpolicyness {lag} batches (+ update_weights_interval - 1, + partial_rollout_max_split - 1): "
            "no trajectory would ever be stale; null says so",
        )
    if not keys.in_flight_weight_updates:
        for name, on in (
            ("update_weights_interval", interval > 1),
            ("recompute_kv_cache_after_weight_updates", keys.recompute_kv_cache_after_weight_updates),
        ):
            if on:
                raise ConfigError(_key(name), "applies to in-flight weight updates: set in_flight_weight_updates true")
        return
    if interval > lag + 1:
        raise ConfigError(
            _key("update_weights_interval"),
            f"{interval} is above max_head_offpolicyness + 1 = {lag + 1}: the batch of an iteration right before a "
            "push would need weights the engines never get before it is due",
        )
    if rl.router_replay is not None:
        raise ConfigError(
            "rl_config.router_replay",
            "records one forward's routes per request, but an in-flight update splits a request's forwards "
            "between two versions: turn in_flight_weight_updates off",
        )
    if cfg.actor.model.vision_config:
        raise ConfigError(
            _key("in_flight_weight_updates"),
            "takes text prompts: a vision-language model's rollout goes through vLLM's whole-request path",
        )


def check(cfg: PPOConfig) -> None:
    rl = cfg.rl
    check_in_flight(cfg)
    if rl.max_head_offpolicyness == 0:
        return
    if rl.rollout_resource is None:
        raise ConfigError(
            "rl_config.max_head_offpolicyness",
            "asynchronous rollout needs rollout workers of their own: set rl_config.rollout_resource",
        )
    check_async_lag(rl.max_head_offpolicyness, cfg.megatron_training.train_iters)


def plan_lines(cfg: PPOConfig) -> List[str]:
    rl, keys = cfg.rl, cfg.rl.async_training
    lag = rl.max_head_offpolicyness
    if lag == 0:
        return []
    lines = []
    if keys.in_flight_weight_updates:
        every = "every update" if keys.update_weights_interval == 1 else f"every {keys.update_weights_interval} updates"
        kv = "recomputed" if keys.recompute_kv_cache_after_weight_updates else "kept"
        lines.append(
            f"  async     : fully asynchronous: the rollout workers generate up to {lag} batch(es) ahead; {every} "
            f"the weights reach them in flight (pause, load, resume; KV cache {kv})"
        )
    else:
        lines.append(
            f"  async     : the rollout workers generate up to {lag} batch(es) ahead of training (each sampled at "
            "most that many versions before it trains)"
        )
    if keys.max_staleness is not None:
        lines.append(
            f"  staleness : a group with a token more than {keys.max_staleness} versions old is "
            + ("dropped" if keys.stale_trajectories == "drop" else "regenerated")
        )
    return lines
