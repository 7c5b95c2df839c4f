"""``rl_config.rollout_fault_tolerance``: deadlines on the rollout side and, for rollout workers of their own, engines
that fail without failing the run; the rules across its keys and the layout are features/fault_tolerance.py's."""

from __future__ import annotations

from dataclasses import dataclass

from .base import opt


@dataclass
class RolloutFaultToleranceConfig:
    """Deadlines, health checks and restarts of the rollout engines (docs/operations.md)."""

    enabled: bool = opt(
        False,
        "Rollout workers of their own: an engine that dies, hangs or answers garbage leaves service, its requests "
        "go to the healthy engines (same seeds), and it restarts with the current weights (NeMo-RL's "
        "generation_fleet_health.enabled, slime's --use-fault-tolerance). false: it stops the run (max_restarts).",
    )
    generate_timeout_s: float = opt(3600.0, "Seconds one generate call of an engine may take (all modes).", gt=0)
    weight_sync_timeout_s: float = opt(
        600.0, "Seconds a weight sync may take on each engine (NeMo-RL's refit_timeout_s; all modes).", gt=0
    )
    setup_timeout_s: float = opt(
        1800.0, "Seconds an engine's start may take: process, model, KV cache, weight channel (all modes).", gt=0
    )
    health_check_interval_s: float = opt(
        10.0,
        "Seconds between two health probes of a generating engine (slime's --rollout-health-check-interval).",
        gt=0,
    )
    health_check_timeout_s: float = opt(
        60.0, "Seconds a health probe may wait for its answer (slime's --rollout-health-check-timeout).", gt=0
    )
    max_restarts_per_engine: int = opt(
        3, "Restarts of one engine; then it stays out (NeMo-RL's max_restart_attempts_per_shard).", ge=0
    )
    min_healthy_engines: int = opt(
        1, "Below this many engines in service the run ends its iteration, saves and exits (min_healthy_shards).", ge=1
    )
