"""The reward-model training config (cli/train_rm.py): the PPO config's sections where they mean the same thing.

    megatron_training   the model, tokenizer, pair datasets (data_path, test_data_path), global_batch_size
                        (preference pairs per optimizer step), seq_length (the longest prompt + answer kept),
                        train_iters (optimizer steps), save_interval, seed
    reward_config       the reward model's own overrides (parallelism, lr, LoRA, load / save / finetune, save_hf);
                        micro_batch_size counts pairs (each pair is two sequences in one micro-batch)
    rl_config           reward_resource (devices), test_freq / val_before_train (held-out pair accuracy), logging,
                        use_remove_padding, the guards (max_nonfinite_steps, max_restarts)

What it trains is what a PPO run loads as ``reward_config`` (the same section, the same checkpoint layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from .base import ConfigError, build_section, closest_key
from .feature_rules import LORA_TARGETS, check_lora_rank
from .megatron_config import MegatronConfig
from .ppo_config import RoleConfig, _role
from .rl_config import RLConfig, build_rl_section
from .rules import check_role_parallelism, check_role_training

TOP_LEVEL_KEYS = ("defaults", "model", "megatron_training", "reward_config", "rl_config", "dry_run", "hydra")
# the rl_config keys reward-model training reads; any other is refused (it would be silently ignored)
RL_KEYS = (
    "reward_resource",
    "use_remove_padding",
    "test_freq",
    "val_before_train",
    "max_nonfinite_steps",
    "max_restarts",
    "console_metrics",
    "library_logs",
    "use_tensorboard",
    "use_wandb",
    "wandb_project",
    "wandb_exp_name",
    "wandb_save_dir",
    "log_dir",
)


@dataclass
class RMConfig:
    megatron_training: MegatronConfig
    reward: RoleConfig
    rl: RLConfig
    dry_run: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def pairs_per_step(self) -> int:
        return self.reward.megatron.global_batch_size

    @property
    def roles(self) -> List[RoleConfig]:
        return [self.reward]

    @property
    def training_roles(self) -> List[RoleConfig]:
        """The role that trains, saves and resumes (failures.py restarts and resumes it)."""
        return [self.reward]

    @property
    def world_size(self) -> int:
        return self.reward.num_devices

    @property
    def validates(self) -> bool:
        return self.rl.test_freq > 0


def build_rm_config(data: Mapping[str, Any], config_dir: Optional[str] = None) -> RMConfig:
    """Validate the composed mapping of a reward-model training config (raises ConfigError naming the key)."""
    if not isinstance(data, Mapping):
        raise ConfigError("", "the config must be a mapping of sections")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            hint = closest_key(str(key), TOP_LEVEL_KEYS)
            raise ConfigError(
                str(key),
                "not a section of a reward-model training config ("
                + ", ".join(k for k in TOP_LEVEL_KEYS if k not in ("defaults", "hydra"))
                + ")"
                + (f"; did you mean '{hint}'?" if hint else ""),
            )
    models = data.get("model") or {}
    if not isinstance(models, Mapping):
        raise ConfigError("model", "must map model names to their architecture sections")
    base = data.get("megatron_training")
    if not isinstance(base, Mapping):
        raise ConfigError("megatron_training", "required section is missing or not a mapping")
    rl_data = data.get("rl_config") or {}
    if not isinstance(rl_data, Mapping):
        raise ConfigError("rl_config", "must be a mapping")
    for key in rl_data:
        if key not in RL_KEYS:
            raise ConfigError(
                f"rl_config.{key}",
                "is not read by reward-model training; it reads " + ", ".join(RL_KEYS),
            )
    megatron_training = build_section(MegatronConfig, base, "megatron_training", require=False)
    rl = build_rl_section(rl_data)
    if rl.reward_resource is None:
        raise ConfigError("rl_config.reward_resource", "required: the devices the reward model trains on")
    if data.get("reward_config") is not None and not isinstance(data["reward_config"], Mapping):
        raise ConfigError("reward_config", "must be a mapping")
    reward = _role("reward", "reward_config", data, base, models, config_dir, rl.reward_resource.num_npus)
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ConfigError("dry_run", f"got {dry_run!r}, expected true or false")
    cfg = RMConfig(megatron_training=megatron_training, reward=reward, rl=rl, dry_run=dry_run, raw=dict(data))
    check_rm_rules(cfg)
    return cfg


def check_rm_rules(cfg: RMConfig) -> None:
    """The role's layout and training keys as in a PPO run, then the pair batches and the held-out set."""
    role, m = cfg.reward, cfg.reward.megatron
    check_role_parallelism(role)
    check_role_training(role)
    check_lora_rank(role)
    if m.lora_r and role.cp > 1 and m.context_parallel_algo == "megatron_cp_algo":
        raise ConfigError("reward_config.context_parallel_algo", "use ulysses_cp_algo with lora_r")
    if m.stage != "rm" and "stage" in (cfg.raw.get("megatron_training") or {}):
        raise ConfigError("megatron_training.stage", f"{m.stage!r} is a PPO trainer: reward-model training is rm")
    if cfg.rl.use_remove_padding and role.pp > 1:
        raise ConfigError(
            "rl_config.use_remove_padding", f"needs pipeline_model_parallel_size 1; the reward model has PP {role.pp}"
        )
    unknown = [t for t in m.lora_target_modules if t not in LORA_TARGETS]
    if m.lora_r and (unknown or not m.lora_target_modules):
        raise ConfigError(
            "reward_config.lora_target_modules", f"{unknown or 'empty'}: choose among {', '.join(LORA_TARGETS)}"
        )
    limit = role.model.max_position_embeddings
    if limit and m.seq_length > limit:
        raise ConfigError(
            "megatron_training.seq_length", f"{m.seq_length} is above the model's max_position_embeddings {limit}"
        )
    if not m.data_path:
        raise ConfigError("megatron_training.data_path", "required: the preprocessed preference pairs")
    if m.global_batch_size % (m.micro_batch_size * role.dp):
        raise ConfigError(
            "reward_config.micro_batch_size",
            f"global_batch_size {m.global_batch_size} pairs over DP {role.dp} gives "
            f"{m.global_batch_size / role.dp:g} pairs per rank, not a multiple of micro_batch_size "
            f"{m.micro_batch_size}",
        )
    if cfg.validates and not m.test_data_path:
        raise ConfigError("megatron_training.test_data_path", "required by rl_config.test_freq: the held-out pairs")
    if m.dataset_additional_keys:
        raise ConfigError(
            "megatron_training.dataset_additional_keys",
            f"{m.dataset_additional_keys}: pairs carry their own fields (input_ids, chosen_ids, rejected_ids); "
            "remove it",
        )
