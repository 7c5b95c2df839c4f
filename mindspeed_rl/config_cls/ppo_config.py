"""The whole PPO run config: its sections composed into PPOConfig (roles merged with
megatron_training; the types themselves in run_config.py), the derived values (derive), then the cross-key
rules (rules.py)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Tuple

from .algorithm_choice import AlgorithmChoiceError, resolve_algorithm
from .base import ConfigError, build_section, closest_key
from .generate_config import GenerateConfig
from .judge_config import JudgeConfig
from .megatron_config import MegatronConfig
from .model_config import ModelConfig
from .precision_rules import derive_rollout_correction
from .profiler_config import build_profiler_config
from .rl_config import build_rl_section
from .rules import check_cross_fields
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
    checked by trainer/config_names.py)."""
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


def build_ppo_config(data: Mapping[str, Any], config_dir: Optional[str] = None) -> PPOConfig:
    """Validate the composed config mapping and return the typed config (raises ConfigError)."""
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
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ConfigError("dry_run", f"got {dry_run!r}, expected true or false")
    derive_rollout_correction(rl, generate)  # before the algorithm: it decides the importance weights
    try:
        algorithm = resolve_algorithm(rl)
    except AlgorithmChoiceError as exc:
        raise ConfigError(exc.key, exc.message) from None
    cfg = PPOConfig(
        megatron_training=megatron_training,
        actor=actor,
        critic=critic,
        reward=reward,
        teacher=teacher,
        judge=judge,
        rl=rl,
        generate=generate,
        algorithm=algorithm,
        dry_run=dry_run,
        raw=dict(data),
    )
    profiler.check_ranks({role.name: role.num_devices for role in cfg.roles})
    for role in cfg.roles:
        role.profiler = profiler.of(role.name)
    derive(cfg)
    check_cross_fields(cfg)
    return cfg


def derive(cfg: PPOConfig) -> None:
    """Every value computed from others, before the rules (which only read; the algorithm is resolved when
    the config is built): with use_dynamic_bsz, the unset packing budgets (forward or update micro-batch x the
    longest sequence)."""
    rl = cfg.rl
    if rl.use_dynamic_bsz:
        longest = rl.max_prompt_length + cfg.generate.sampling_config.max_tokens
        update_mbs = max(role.megatron.micro_batch_size for role in cfg.training_roles)
        defaults = {
            "ref_max_packing_token_size": rl.ref_forward_micro_batch_size * longest,
            "actor_max_packing_token_size": rl.actor_forward_micro_batch_size * longest,
            "update_max_packing_token_size": update_mbs * longest,
        }
        for key, default in defaults.items():
            if getattr(rl, key) is None:
                setattr(rl, key, default)


def to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj
