"""The whole PPO run config: its sections composed into PPOConfig (roles merged with megatron_training; the types
themselves in run_config.py), each section checked on its own. The derived values and the rules across keys are
the features' (mindspeed_rl/features/: ``features.build_ppo_config`` runs them)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Tuple

from .base import ConfigError, build_section, closest_key
from .eval_config import EvalConfig
from .generate_config import GenerateConfig
from .judge_config import JudgeConfig
from .megatron_config import MegatronConfig
from .model_config import ModelConfig
from .profiler_config import build_profiler_config
from .rl_config import build_rl_section
from .run_config import PPOConfig, RoleConfig
from .yaml_guard import load_yaml

TOP_LEVEL_KEYS = (
    "defaults",
    "model",
    "megatron_training",
    "actor_config",
    "critic_config",
    "rl_config",
    "generate_config",
    "reward_config",
    "teacher_config",
    "judge_config",
    "profiler_config",
    "eval_config",
    "dry_run",
    "hydra",
)


def model_section_data(name: str, models: Mapping[str, Any], config_dir: Optional[str], key: str) -> Mapping:
    if name in models:
        return models[name]
    if config_dir:
        path = os.path.join(config_dir, "model", f"{name}.yaml")
        if os.path.isfile(path):
            data = load_yaml(path) or {}
            return data.get(name, data)
    known = sorted(models)
    if config_dir and os.path.isdir(os.path.join(config_dir, "model")):
        known += sorted(f[:-5] for f in os.listdir(os.path.join(config_dir, "model")) if f.endswith(".yaml"))
    hint = closest_key(name, known)
    raise ConfigError(
        key,
        f"model {name!r} is not defined under `model:` nor as configs/model/{name}.yaml"
        + (f"; did you mean {hint!r}?" if hint else ""),
    )


def build_model_section(data: Mapping, path: str) -> ModelConfig:
    """A model section, checked on its own (raises ConfigError naming the key; its family's requirements are
    checked by trainer/startup/config_names.py)."""
    return build_section(ModelConfig, data, path)


def _role(
    name: str,
    section_key: str,
    data: Mapping,
    base: Mapping,
    models: Mapping,
    config_dir: Optional[str],
    num_devices: int,
) -> RoleConfig:
    overrides = data.get(section_key, {})
    build_section(MegatronConfig, overrides, section_key, require=False)  # names the role's own bad keys
    merged = {**base, **overrides}
    where = section_key if "model" in overrides else "megatron_training"
    megatron = build_section(MegatronConfig, merged, where)
    model_name = megatron.model
    model_data = model_section_data(model_name, models, config_dir, f"{where}.model")
    model = build_model_section(model_data, f"model.{model_name}")
    return RoleConfig(name=name, megatron=megatron, model=model, num_devices=num_devices)


def model_and_base(data: Mapping[str, Any]) -> Tuple[Mapping, Mapping]:
    """The ``model`` architectures and the ``megatron_training`` base every role merges its section into."""
    models = data.get("model") or {}
    if not isinstance(models, Mapping):
        raise ConfigError("model", "must map model names to their architecture sections")
    base = data.get("megatron_training")
    if not isinstance(base, Mapping):
        raise ConfigError("megatron_training", "required section is missing or not a mapping")
    return models, base


def assemble_ppo_config(data: Mapping[str, Any], config_dir: Optional[str] = None) -> PPOConfig:
    """The typed config of a composed mapping, each section checked on its own (raises ConfigError); nothing
    derived yet and no rule across keys run: ``features.build_ppo_config`` does both."""
    if not isinstance(data, Mapping):
        raise ConfigError("", "the config must be a mapping of sections")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            hint = closest_key(str(key), TOP_LEVEL_KEYS)
            raise ConfigError(str(key), "unknown section" + (f"; did you mean '{hint}'?" if hint else ""))
    models, base = model_and_base(data)
    megatron_training = build_section(MegatronConfig, base, "megatron_training", require=False)
    rl = build_rl_section(data.get("rl_config", {}))
    generate = build_section(GenerateConfig, data.get("generate_config", {}), "generate_config")
    actor = _role("actor", "actor_config", data, base, models, config_dir, rl.actor_resource.num_npus)
    critic = _role("critic", "critic_config", data, base, models, config_dir, rl.critic_resource.num_npus)
    reward = None
    if data.get("reward_config") is not None:
        if rl.reward_resource is None:
            raise ConfigError("rl_config.reward_resource", "required when reward_config is given")
        reward = _role("reward", "reward_config", data, base, models, config_dir, rl.reward_resource.num_npus)
    teacher = None
    if data.get("teacher_config") is not None:
        if rl.teacher_resource is None:
            raise ConfigError("rl_config.teacher_resource", "required when teacher_config is given")
        teacher = _role("teacher", "teacher_config", data, base, models, config_dir, rl.teacher_resource.num_npus)
    judge = None
    if data.get("judge_config") is not None:
        judge = build_section(JudgeConfig, data["judge_config"], "judge_config")
    profiler = build_profiler_config(data.get("profiler_config"))
    evaluation = build_section(EvalConfig, data["eval_config"], "eval_config") if "eval_config" in data else None
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ConfigError("dry_run", f"got {dry_run!r}, expected true or false")
    return PPOConfig(
        megatron_training=megatron_training,
        actor=actor,
        critic=critic,
        reward=reward,
        teacher=teacher,
        judge=judge,
        rl=rl,
        generate=generate,
        dry_run=dry_run,
        raw=dict(data),
        profiler=profiler,
        evaluation=evaluation,
    )


def to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj
