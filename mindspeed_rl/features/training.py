"""What a training role learns with and where it saves: the learning-rate floor, the HF copy beside each checkpoint,
and save folders apart."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from ..config_cls.run_config import role_key

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig


def check_role(role: RoleConfig) -> None:
    """The learning-rate floor; an HF copy of each checkpoint needs a save folder all ranks share."""
    m = role.megatron
    if m.min_lr > m.lr:
        raise ConfigError(role_key(role, "min_lr"), f"{m.min_lr} is above lr {m.lr}")
    if m.save_hf and not m.save:
        raise ConfigError(
            role_key(role, "save_hf"),
            "is true but save is not set: the HF folder is written beside each checkpoint in save",
        )
    if m.save_hf and m.no_shared_storage:
        raise ConfigError(
            role_key(role, "save_hf"),
            "needs a filesystem all ranks share (no_shared_storage is "
            "true): convert afterwards with cli/convert_ckpt.py",
        )


def check(cfg: PPOConfig) -> None:
    """Actor and critic save to folders of their own."""
    a_save, c_save = cfg.actor.megatron.save, cfg.critic.megatron.save
    if cfg.uses_critic and a_save and c_save and os.path.abspath(a_save) == os.path.abspath(c_save):
        raise ConfigError(
            "critic_config.save", f"{c_save!r} is also the actor's save folder; actor and critic need separate folders"
        )
