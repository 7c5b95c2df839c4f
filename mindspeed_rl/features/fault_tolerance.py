"""Rollout engines that fail without failing the run (rl_config.rollout_fault_tolerance): deadlines on every generate
call, weight sync and engine start; with ``enabled`` and rollout workers of their own, a failed engine is taken out of
service, its requests move to the healthy engines and it is restarted with the current weights
(workers/rollout_fleet.py). The colocated engines live in the actor's processes: their failure restarts the run."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def _key(name: str) -> str:
    return f"rl_config.rollout_fault_tolerance.{name}"


def rollout_engines(cfg: PPOConfig) -> int:
    """Engines of the rollout workers of their own: rollout devices / infer TP (0 when the actor generates)."""
    return cfg.rollout_devices // max(1, cfg.generate.infer_tensor_parallel_size)


def check(cfg: PPOConfig) -> None:
    keys = cfg.rl.rollout_fault_tolerance
    if not keys.enabled:
        return
    engines = rollout_engines(cfg)
    if engines == 0:
        raise ConfigError(
            _key("enabled"),
            "takes rollout workers of their own (rl_config.rollout_resource): a colocated engine lives in the "
            "actor's processes, and its failure restarts the run from its last checkpoint (rl_config.max_restarts)",
        )
    if keys.min_healthy_engines > engines:
        raise ConfigError(
            _key("min_healthy_engines"),
            f"{keys.min_healthy_engines} is above the run's {engines} rollout engine(s) "
            f"(rl_config.rollout_resource.num_npus {cfg.rollout_devices} / generate_config.infer_tensor_parallel_size "
            f"{cfg.generate.infer_tensor_parallel_size}): the run could never start",
        )
    if keys.health_check_timeout_s >= keys.generate_timeout_s:
        raise ConfigError(
            _key("health_check_timeout_s"),
            f"{keys.health_check_timeout_s:g} is not below generate_timeout_s {keys.generate_timeout_s:g}: a hung "
            "engine would pass its generate deadline before its health check could tell",
        )


def plan_lines(cfg: PPOConfig) -> List[str]:
    keys = cfg.rl.rollout_fault_tolerance
    deadlines = (
        f"deadlines: generate {keys.generate_timeout_s:g} s, weight sync {keys.weight_sync_timeout_s:g} s, "
        f"engine start {keys.setup_timeout_s:g} s"
    )
    if not keys.enabled:
        if not rollout_engines(cfg):
            return []
        return [f"  faults    : a rollout engine that dies or passes a deadline stops the run; {deadlines}"]
    return [
        f"  faults    : {rollout_engines(cfg)} rollout engine(s), at least {keys.min_healthy_engines} in service: a "
        f"failed one's requests move to the others, it restarts (up to {keys.max_restarts_per_engine} times) with "
        f"the current weights; health probe every {keys.health_check_interval_s:g} s "
        f"(answer within {keys.health_check_timeout_s:g} s); {deadlines}"
    ]
