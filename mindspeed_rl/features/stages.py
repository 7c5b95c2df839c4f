"""The rules of a single-role stage's config (reward-model training, SFT, DPO): its role's keys as in a PPO run (every
feature's check_role, LoRA, the trackers), then the stage's batches, data and held-out set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from . import lora, tracking
from .loop import check_role

if TYPE_CHECKING:
    from ..config_cls.stage_config import StageConfig


def check(cfg: StageConfig) -> None:
    """The role's layout and training keys as in a PPO run, then the batches and the held-out set."""
    role, m, spec = cfg.role, cfg.role.megatron, cfg.stage
    section = spec.section
    check_role(role)
    lora.check_targets(role)
    lora.check_rank(role)
    tracking.check_trackers(cfg.rl)
    if cfg.dpo is not None and cfg.dpo.ref_model and m.lora_r:
        raise ConfigError(
            "dpo_config.ref_model", "with lora_r the reference is the base model (adapters off); remove it"
        )
    if m.stage != spec.name and "stage" in (cfg.raw.get("megatron_training") or {}):
        raise ConfigError("megatron_training.stage", f"{m.stage!r} is not {spec.title}, whose stage is {spec.name}")
    if cfg.rl.use_remove_padding and role.pp > 1:
        raise ConfigError(
            "rl_config.use_remove_padding", f"needs pipeline_model_parallel_size 1; the {spec.role} has PP {role.pp}"
        )
    limit = role.model.max_position_embeddings
    if limit and m.seq_length > limit:
        raise ConfigError(
            "megatron_training.seq_length", f"{m.seq_length} is above the model's max_position_embeddings {limit}"
        )
    if not m.data_path:
        raise ConfigError("megatron_training.data_path", f"required: the preprocessed {spec.data}")
    if m.global_batch_size % (m.micro_batch_size * role.dp):
        raise ConfigError(
            f"{section}.micro_batch_size",
            f"global_batch_size {m.global_batch_size} {spec.unit} over DP {role.dp} gives "
            f"{m.global_batch_size / role.dp:g} {spec.unit} per rank, not a multiple of micro_batch_size "
            f"{m.micro_batch_size}",
        )
    if cfg.validates and not m.test_data_path:
        raise ConfigError(
            "megatron_training.test_data_path", f"required by rl_config.test_freq: the held-out {spec.data}"
        )
    if m.dataset_additional_keys:
        raise ConfigError(
            "megatron_training.dataset_additional_keys",
            f"{m.dataset_additional_keys}: {spec.data} carry their own fields; remove it",
        )
