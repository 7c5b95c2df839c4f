"""A run's config as every entry point gets it: composed (config_cls.loader), typed (config_cls), every derived value
filled in and every rule across keys passed (the features' loops)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..config_cls.loader import compose
from ..config_cls.ppo_config import assemble_ppo_config
from ..config_cls.run_config import PPOConfig
from ..config_cls.stage_config import StageConfig, assemble_stage_config
from . import loop, stages


def build_ppo_config(data: Mapping[str, Any], config_dir: Optional[str] = None) -> PPOConfig:
    """Validate the composed config mapping and return the typed config (raises ConfigError naming the key)."""
    cfg = assemble_ppo_config(data, config_dir)
    loop.derive(cfg)
    loop.check(cfg)
    return cfg


def load_ppo_config(config_name: str, overrides: Sequence[str] = (), config_dir: Optional[str] = None) -> PPOConfig:
    data, resolved_dir = compose(config_name, overrides, config_dir)
    data.pop("defaults", None)
    return build_ppo_config(data, resolved_dir)


def build_stage_config(data: Mapping[str, Any], stage: str, config_dir: Optional[str] = None) -> StageConfig:
    """Validate the composed mapping of a single-role stage's config (raises ConfigError naming the key)."""
    cfg = assemble_stage_config(data, stage, config_dir)
    stages.check(cfg)
    return cfg


def load_stage_config(
    stage: str, config_name: str, overrides: Sequence[str] = (), config_dir: Optional[str] = None
) -> StageConfig:
    """A single-role stage's config (``stage``: rm for cli/train_rm.py, sft for cli/train_sft.py, dpo for
    cli/train_dpo.py), composed as a PPO config is."""
    data, resolved_dir = compose(config_name, overrides, config_dir)
    data.pop("defaults", None)
    return build_stage_config(data, stage, resolved_dir)
