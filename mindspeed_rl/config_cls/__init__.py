"""Typed configuration: each section checked on its own (no torch import: fails fast on bad input). The rules across
keys and the derived values are the features' (mindspeed_rl/features/), whose loaders every entry point uses."""

from .base import ConfigError
from .generate_config import GenerateConfig, SamplingConfig
from .loader import compose
from .megatron_config import MegatronConfig
from .model_config import ModelConfig
from .ppo_config import assemble_ppo_config
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
    "assemble_ppo_config",
    "compose",
]
