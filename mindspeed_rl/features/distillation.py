"""On-policy distillation (rl_config.distill_coef, teacher_config): a frozen teacher scores every sampled token and
its signal joins the advantages."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def check(cfg: PPOConfig) -> None:
    """A teacher exactly when distillation is on; pure distillation (no reward) trains no critic."""
    rl = cfg.rl
    if rl.distill_coef and cfg.teacher is None:
        raise ConfigError(
            "rl_config.distill_coef",
            f"{rl.distill_coef:g} needs a teacher: give teacher_config (and rl_config.teacher_resource)",
        )
    if cfg.teacher is not None and not rl.distill_coef:
        raise ConfigError(
            "rl_config.distill_coef",
            "is 0 but teacher_config is given: the teacher would score nothing; set distill_coef > 0 "
            "(1.0: the teacher's signal at full weight) or remove teacher_config",
        )
    if cfg.teacher is not None and cfg.samples_per_iteration % cfg.teacher.dp:
        raise ConfigError(
            "rl_config.teacher_resource.num_npus",
            f"the teacher's DP {cfg.teacher.dp} does not divide the {cfg.samples_per_iteration} responses of an "
            "iteration it scores",
        )
    saves, teacher_load = cfg.actor.megatron.save, cfg.teacher.megatron.load if cfg.teacher is not None else None
    if saves and teacher_load and os.path.abspath(saves) == os.path.abspath(teacher_load):
        raise ConfigError(
            "actor_config.save",
            f"{saves!r} is the teacher's load folder: the student's checkpoints would overwrite the teacher; "
            "save the student elsewhere",
        )
    rewarded = (rl.rule_reward and any(rl.verifier_weight)) or cfg.reward is not None
    if rl.distill_coef and not rewarded and cfg.uses_critic:
        raise ConfigError(
            "rl_config.adv_estimator",
            f"{rl.adv_estimator} trains a critic on the rewards, and nothing rewards this run (pure distillation): "
            "use a critic-free estimator (grpo, rloo, reinforce_plus_plus), or give a reward",
        )


def plan_lines(cfg: PPOConfig) -> List[str]:
    """What the teacher adds to the advantages, and where it runs."""
    rl, teacher = cfg.rl, cfg.teacher
    if teacher is None:
        return []
    clip = f"clipped to +-{rl.distill_clip:g}" if rl.distill_clip else "unclipped"
    where = "on the actor's devices" if rl.teacher_colocate else f"on {teacher.num_devices} devices of its own"
    return [
        f"  distill   : teacher {teacher.megatron.model} from {teacher.megatron.load} ({where}) scores every sampled "
        f"token; A = A_reward + {rl.distill_coef:g} x {rl.distill_loss} ({clip})"
    ]
