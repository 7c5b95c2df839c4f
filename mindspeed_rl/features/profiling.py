"""profiler_config: each role of the run gets its own settings, and profiles only ranks it has."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def derive(cfg: PPOConfig) -> None:
    for role in cfg.roles:
        role.profiler = cfg.profiler.of(role.name) if cfg.profiler is not None else None


def check(cfg: PPOConfig) -> None:
    if cfg.profiler is not None:
        cfg.profiler.check_ranks({role.name: role.num_devices for role in cfg.roles})
