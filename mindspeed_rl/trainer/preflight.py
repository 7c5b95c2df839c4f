"""Checks that take seconds and run before Ray starts: every path the run will write or read is usable.

A problem raises UserError naming the key and the path (exit 2): an unwritable save folder is found
before any training, a broken checkpoint before any worker starts.
"""
from __future__ import annotations

import os
import tempfile
import zipfile
from typing import List, Optional, Tuple

from ..checkpoint import megatron_layout as ml
from ..compat import vllm as compat_vllm
from ..config_cls.ppo_config import PPOConfig, RoleConfig
from ..utils.cli import UserError


def check_writable(key: str, folder: str) -> None:
    """``folder`` exists (created if needed) and a file can be written in it."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_check_"):
            pass
    except OSError as exc:
        raise UserError(f"{key}: cannot write checkpoints to {folder} ({exc.strerror or exc})") from None


def checkpoint_files(iter_dir: str) -> List[str]:
    return sorted(os.path.join(root, name) for root, _, names in os.walk(iter_dir) for name in names
                  if name.endswith(".pt"))


def check_checkpoint(key: str, folder: str, layout: Optional[Tuple[int, int]] = None) -> None:
    """The tracker is valid, the iteration it names exists with the expected TP x PP layout, and every
    file in it is complete (a torch checkpoint is a zip: a truncated one has no central directory)."""
    try:
        _, iter_dir = ml.latest_iteration_dir(folder)
        ml.checked_layout(folder, iter_dir, layout)
    except ml.CheckpointError as exc:
        raise UserError(f"{key}: {exc}") from None
    for path in checkpoint_files(iter_dir):
        try:
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
        except (zipfile.BadZipFile, OSError) as exc:
            raise UserError(f"{key}: {path} is truncated or corrupt ({exc})") from None


def check_role(role: RoleConfig) -> None:
    m, section = role.megatron, f"{role.name}_config"
    if m.save:
        check_writable(f"{section}.save", m.save)
    if m.load and (m.finetune or ml.read_tracker_or_none(m.load) is not None):
        check_checkpoint(f"{section}.load", m.load, (role.tp, role.pp, m.expert_model_parallel_size))


def check_environment() -> None:
    """Environment switches the workers read are valid (a typo would otherwise fail at the first rollout)."""
    try:
        compat_vllm.requested_weight_load()
    except ValueError as exc:
        raise UserError(str(exc)) from None


def preflight(cfg: PPOConfig) -> None:
    check_environment()
    roles = cfg.roles
    for role in roles:
        check_role(role)
    ref = cfg.rl.integrated_mode_config.ref_model_load_path
    if ref:
        check_checkpoint("rl_config.integrated_mode_config.ref_model_load_path", ref,
                         (cfg.actor.tp, cfg.actor.pp, cfg.actor.megatron.expert_model_parallel_size))
