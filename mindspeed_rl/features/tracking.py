"""The experiment trackers (rl_config.use_tensorboard / use_wandb / use_swanlab): one switched on must be installed,
refused before anything starts, not at the first iteration."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.logging_config import LoggingKeys
    from ..config_cls.run_config import PPOConfig


# the trackers a switch needs: (switch, importable module, what to install)
TRACKERS = (
    ("use_tensorboard", "tensorboard", "tensorboard"),
    ("use_wandb", "wandb", "wandb"),
    ("use_swanlab", "swanlab", "swanlab (requirements/cpu.txt has the pin)"),
)


def check_trackers(rl: LoggingKeys, section: str = "rl_config") -> None:
    for key, module, package in TRACKERS:
        if getattr(rl, key) and importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"{section}.{key}", f"{module} is not installed here: pip install {package}, or set false"
            )


def check(cfg: PPOConfig) -> None:
    check_trackers(cfg.rl)
