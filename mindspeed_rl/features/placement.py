"""Where the roles run: integrated mode (the roles share the actor's devices, which they must fit), whether the critic's
stages run beside the actor's (``blocking``), the frozen roles' weights, and MindSpeed-RL's switches we name but do
not implement."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError
from ..config_cls.megatron_config import STAGE_ENTRY_POINTS

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def check_worker_modes(cfg: PPOConfig) -> None:
    """MindSpeed-RL switches we name but do not implement."""
    rl = cfg.rl
    stage = cfg.megatron_training.stage
    if stage in STAGE_ENTRY_POINTS:
        raise ConfigError("megatron_training.stage", f"{stage} is {STAGE_ENTRY_POINTS[stage]}")
    if not rl.use_integrated_worker:
        raise ConfigError(
            "rl_config.use_integrated_worker",
            "false (actor, reference and critic in workers on devices "
            "of their own) is not implemented: the roles share the "
            "actor's devices; for rollout on devices of its own set "
            "rl_config.rollout_resource",
        )


def check_role_resources(cfg: PPOConfig) -> None:
    """The frozen roles' weights, and the roles that share the actor's devices fit on them."""
    if cfg.teacher is not None:
        if not cfg.teacher.megatron.load:
            raise ConfigError(
                "teacher_config.load",
                "required: the teacher's weights (an mcore checkpoint: a trained run's save folder, or an HF model "
                "converted with cli/convert_ckpt.py)",
            )
        if cfg.rl.teacher_colocate and cfg.teacher.num_devices > cfg.actor.num_devices:
            raise ConfigError(
                "rl_config.teacher_resource.num_npus",
                f"{cfg.teacher.num_devices} exceeds actor_resource.num_npus {cfg.actor.num_devices}: a colocated "
                "teacher shares the actor's devices; set rl_config.teacher_colocate false to give it its own",
            )
    if cfg.reward is not None:
        if not cfg.reward.megatron.load:
            raise ConfigError(
                "reward_config.load",
                "required: the reward model's weights (a checkpoint converted with cli/convert_ckpt.py --orm)",
            )
        if cfg.reward.num_devices > cfg.actor.num_devices:
            raise ConfigError(
                "rl_config.reward_resource.num_npus",
                f"{cfg.reward.num_devices} exceeds actor_resource.num_npus {cfg.actor.num_devices}: "
                "in integrated mode the reward model shares the actor's devices",
            )
    if cfg.uses_critic and cfg.critic.num_devices > cfg.actor.num_devices:
        raise ConfigError(
            "rl_config.critic_resource.num_npus",
            f"{cfg.critic.num_devices} exceeds actor_resource.num_npus {cfg.actor.num_devices}: "
            "in integrated mode the critic shares the actor's devices",
        )


def check(cfg: PPOConfig) -> None:
    check_worker_modes(cfg)
    check_role_resources(cfg)


def plan_lines(cfg: PPOConfig) -> List[str]:
    """With ``blocking: false``, what runs beside what."""
    if cfg.rl.blocking:
        return []
    if not cfg.uses_critic:
        return ["  stages    : blocking false, but no critic: the actor's worker runs every stage in turn"]
    return [
        "  stages    : the critic's beside the actor's worker's (blocking false): the values forward beside the "
        "actor's worker's forwards, the two updates together (on CPU each with part of the cores)"
    ]
