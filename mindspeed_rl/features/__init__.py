"""The features of a run, one module each: its derived values, its rules across keys, its plan lines and what it
needs of the device (the protocol and the order: loop.py), and the loaders that run them on a composed config."""

from .load import build_ppo_config, build_stage_config, load_ppo_config, load_stage_config
from .loop import FEATURES, check, check_role, derive, plan_lines, preflight

__all__ = [
    "FEATURES",
    "build_ppo_config",
    "build_stage_config",
    "check",
    "check_role",
    "derive",
    "load_ppo_config",
    "load_stage_config",
    "plan_lines",
    "preflight",
]
