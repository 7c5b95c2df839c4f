"""Typed, validated configuration (no torch import: fails fast on bad input)."""

from .base import ConfigError
from .generate_config import GenerateConfig, SamplingConfig
from .loader import compose, load_ppo_config
from .megatron_config import MegatronConfig
from .model_config import ModelConfig
from .ppo_config import build_ppo_config
from .rl_config import RLConfig
from .run_config import PPOConfig, RoleConfig

__all__ = [
    "ConfigError",
    "GenerateConfig",
    "SamplingConfig",
    "MegatronConfig",
    "ModelConfig",
    "RLConfig",
    "PPOConfig",
    "RoleConfig",
    "build_ppo_config",
    "compose",
    "load_ppo_config",
]
