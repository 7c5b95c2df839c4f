"""DAPO's dynamic sampling (rl_config.filter_groups_*): groups whose responses all score alike are dropped and more
prompts drawn until a batch is full; the value compared inside a group (filter_metric_name)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.rl_config import RLConfig
    from ..config_cls.run_config import PPOConfig


def filter_metric_name(rl: RLConfig) -> str:
    """The per-row value dynamic sampling compares inside a group: "score" or a verifier's name."""
    metric = rl.filter_groups_metric
    if metric is None:
        return rl.verifier_function[0] if rl.rule_reward and rl.verifier_function else "score"
    match = re.fullmatch(r"(?:\w+/)?(\w+)_rewards/mean", metric)  # MindSpeed-RL: grpo/<verifier>_rewards/mean
    return match.group(1) if match else metric


def check(cfg: PPOConfig) -> None:
    rl = cfg.rl
    if not rl.filter_groups_enable:
        for key in ("filter_groups_metric", "filter_groups_train_batch_size"):
            if getattr(rl, key) is not None:
                raise ConfigError(f"rl_config.{key}", "is set but filter_groups_enable is false")
    else:
        if rl.n_samples_per_prompt < 2:
            raise ConfigError(
                "rl_config.n_samples_per_prompt",
                "filter_groups_enable compares the responses of one prompt: it needs at least 2 samples per prompt",
            )
        if rl.filter_groups_max_batches == 0:
            raise ConfigError("rl_config.filter_groups_max_batches", "0 would generate nothing; -1 means no limit")
        wanted, batch = rl.filter_groups_train_batch_size, cfg.megatron_training.global_batch_size
        if wanted and rl.filter_groups_max_batches > 0 and wanted > rl.filter_groups_max_batches * batch:
            raise ConfigError(
                "rl_config.filter_groups_train_batch_size",
                f"{wanted} groups can never be filled: at most filter_groups_max_batches "
                f"{rl.filter_groups_max_batches} x megatron_training.global_batch_size {batch} = "
                f"{rl.filter_groups_max_batches * batch} groups are drawn per iteration",
            )
        metric = filter_metric_name(rl)
        known = ["score"] + (list(rl.verifier_function) if rl.rule_reward else [])
        if metric not in known:
            raise ConfigError(
                "rl_config.filter_groups_metric",
                f"{rl.filter_groups_metric!r} is neither score nor a verifier of verifier_function "
                f"({', '.join(known)})",
            )
