"""On-policy distillation: a frozen teacher scores every token the student sampled, and the student is pushed
toward the teacher on its own samples.

Shapes: [B, R] over response tokens; ``mask`` is the loss mask (1 on the tokens the policy generated, 0 on
prompt, padding and tool output, so tool tokens carry no distillation signal). ``student_log_probs`` are the
log-probs of the policy that sampled (the old log-probs: the advantage is a constant of the update) and
``teacher_log_probs`` the teacher's of the same tokens. The registry (``config_cls/algorithm_choice.py``)
maps a config's ``rl_config.distill_loss`` to a function here; :func:`distill_advantages` calls it.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..config_cls.algorithm_choice import DistillSignal


def reverse_kl_advantages(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    mask: torch.Tensor,
    clip: Optional[float] = None,
) -> torch.Tensor:
    """Per-token advantage of reverse-KL distillation, the negative single-sample estimate of
    KL(student || teacher) at the sampled token y_t:

        A_t = clip(log p_teacher(y_t | y_<t) - log p_student(y_t | y_<t), -c, c) * m_t

    (c = ``clip``, none when None). Maximising sum_t A_t log p_student(y_t) with the PPO update minimises the
    reverse KL on the student's own samples: tokens the teacher finds likelier are pushed up, others down.
    """
    advantage = teacher_log_probs.float() - student_log_probs.float()
    if clip is not None:
        advantage = advantage.clamp(-clip, clip)
    return torch.where(mask.bool(), advantage, torch.zeros_like(advantage))


def distill_advantages(
    signal: DistillSignal,
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    mask: torch.Tensor,
    clip: Optional[float] = None,
) -> torch.Tensor:
    """The registered distillation signal ``signal`` (rl_config.distill_loss): [B, R] advantages."""
    function = globals()[signal.function]
    return function(student_log_probs, teacher_log_probs, mask, clip)


def mix_advantages(
    reward_advantages: Optional[torch.Tensor], distill: torch.Tensor, distill_coef: float, mask: torch.Tensor
) -> torch.Tensor:
    """The advantages the update uses, rewards and teacher together:

        A_t = A^reward_t + lambda * A^distill_t        (lambda = distill_coef)
        A_t = lambda * A^distill_t                      without a reward (pure distillation)
    zero outside ``mask``.
    """
    mixed = distill_coef * distill.float()
    if reward_advantages is not None:
        mixed = reward_advantages.float() + mixed
    return torch.where(mask.bool(), mixed, torch.zeros_like(mixed))


def teacher_student_kl(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor) -> float:
    """The logged teacher-student KL: per response the mean over its tokens of the single-sample estimate
    log p_student(y_t) - log p_teacher(y_t) (an unbiased estimate of KL(student || teacher) on the student's
    samples; one sample can be negative), then the mean over responses:

        KL = 1/B sum_i [ sum_t m_it (log p_S - log p_T)_it / sum_t m_it ]
    Responses without a masked token are left out.
    """
    m = mask.float()
    tokens = m.sum(dim=1)
    per_token = (student_log_probs.float() - teacher_log_probs.float()) * m
    kept = tokens > 0
    if not bool(kept.any()):
        return 0.0
    return float((per_token.sum(dim=1)[kept] / tokens[kept]).mean())
