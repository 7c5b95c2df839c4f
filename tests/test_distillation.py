"""On-policy distillation's math against hand-computed values: the reverse-KL advantage (clipped, masked), the
mix with reward advantages (and pure distillation), the logged teacher-student KL, and the registry entry."""

import pytest
import torch

from mindspeed_rl.algorithms import distillation
from mindspeed_rl.algorithms.distillation import (
    distill_advantages,
    mix_advantages,
    reverse_kl_advantages,
    teacher_student_kl,
)
from mindspeed_rl.config_cls.algorithm_choice import DISTILL_SIGNALS, AlgorithmChoiceError, get_distillation

STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -9.0]])
TEACHER = torch.tensor([[-0.5, -3.0, -0.5], [-1.3, -1.0, -0.1]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])  # row 2's last token: padding or tool output


def test_reverse_kl_advantage_is_teacher_minus_student_on_masked_tokens():
    # T - S = [[0.5, -1.0, 0.0], [-1.0, 3.0, (8.9, masked)]]
    want = torch.tensor([[0.5, -1.0, 0.0], [-1.0, 3.0, 0.0]])
    assert torch.allclose(reverse_kl_advantages(STUDENT, TEACHER, MASK), want)
    clipped = torch.tensor([[0.5, -1.0, 0.0], [-1.0, 2.0, 0.0]])  # c = 2: 3.0 -> 2.0
    assert torch.allclose(reverse_kl_advantages(STUDENT, TEACHER, MASK, clip=2.0), clipped)
    assert torch.allclose(distill_advantages(get_distillation("reverse_kl"), STUDENT, TEACHER, MASK, 2.0), clipped)


def test_rewards_and_teacher_mix_and_pure_distillation_uses_the_teacher_alone():
    distill = torch.tensor([[0.5, -1.0, 0.0], [-1.0, 3.0, 0.0]])
    rewards = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 7.0]])
    # A = A_reward + 0.5 * A_distill, 0 outside the mask
    want = torch.tensor([[1.25, 0.5, 1.0], [-1.5, 0.5, 0.0]])
    assert torch.allclose(mix_advantages(rewards, distill, 0.5, MASK), want)
    assert torch.allclose(mix_advantages(None, distill, 0.5, MASK), torch.tensor([[0.25, -0.5, 0.0], [-0.5, 1.5, 0.0]]))


def test_teacher_student_kl_is_the_mean_over_responses_of_each_responses_token_mean():
    # S - T per token: row 1 [-0.5, 1.0, 0.0] -> 0.5 / 3; row 2 [1.0, -3.0] -> -1.0; mean over the two responses
    assert teacher_student_kl(STUDENT, TEACHER, MASK) == pytest.approx((0.5 / 3 - 1.0) / 2)
    # a response without a loss token is left out; none at all: 0
    assert teacher_student_kl(STUDENT, TEACHER, torch.tensor([[1, 1, 1], [0, 0, 0]])) == pytest.approx(0.5 / 3)
    assert teacher_student_kl(STUDENT, TEACHER, torch.zeros(2, 3)) == 0.0
    # the same model as teacher: 0, and its advantages 0
    assert teacher_student_kl(STUDENT, STUDENT, MASK) == 0.0
    assert not reverse_kl_advantages(STUDENT, STUDENT, MASK).any()


def test_every_distillation_signal_is_a_function_with_its_formula_and_unknown_names_are_refused():
    for name, spec in DISTILL_SIGNALS.items():
        assert "=" in getattr(distillation, spec.function).__doc__, name
    with pytest.raises(AlgorithmChoiceError) as refused:
        get_distillation("forward_kl")
    assert refused.value.key == "rl_config.distill_loss" and "reverse_kl" in str(refused.value)
