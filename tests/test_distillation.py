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


# ----- the teacher role in a config ---------------------------------------------------------------------------
DISTILL = ["--config-name", "distill_tiny_cpu", "dry_run=true"]


def run_dry(overrides, capsys):
    from cli import train_ppo

    rc = train_ppo.main(DISTILL + overrides)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out, out.err


def test_the_distillation_plan_says_what_the_teacher_adds_and_where_it_runs(capsys):
    rc, out, _ = run_dry([], capsys)
    assert rc == 0
    assert "distillation reverse_kl" in out  # the algorithm line
    assert "A = A_reward + 1 x reverse_kl (unclipped)" in out and "(on the actor's devices)" in out
    assert "teacher   : 1 devices = TP 1 x PP 1 x DP 1" in out and "128 samples per DP rank to score" in out
    rc, out, _ = run_dry(["rl_config.teacher_colocate=false", "rl_config.distill_clip=5"], capsys)
    assert rc == 0 and "on 1 devices of its own" in out and "clipped to +-5" in out
    assert "throughput world_size=2" in out  # the teacher's own device counts


@pytest.mark.parametrize(
    "overrides,key,text",
    [
        (["rl_config.distill_coef=0"], "rl_config.distill_coef", "the teacher would score nothing"),
        (["~teacher_config"], "rl_config.distill_coef", "needs a teacher"),
        (["~rl_config.teacher_resource"], "rl_config.teacher_resource", "required when teacher_config"),
        (["teacher_config.load=null"], "teacher_config.load", "required: the teacher's weights"),
        (["rl_config.teacher_resource.num_npus=2"], "rl_config.teacher_resource.num_npus", "teacher_colocate false"),
        (["actor_config.save=./demo_assets/ckpt/actor"], "actor_config.save", "would overwrite the teacher"),
        (["rl_config.distill_loss=forward_kl"], "rl_config.distill_loss", "reverse_kl"),
        (["rl_config.distill_clip=0"], "rl_config.distill_clip", "> 0"),
        (
            ["rl_config.adv_estimator=gae", "+critic_config.model=tiny_qwen25"],
            "rl_config.adv_estimator",
            "nothing rewards this run",
        ),
        (
            ["rl_config.teacher_colocate=false", "rl_config.teacher_resource.num_npus=3"],
            "rl_config.teacher_resource.num_npus",
            "does not divide the 128 responses",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_teacher_config_that_cannot_work_is_refused_naming_the_key(overrides, key, text, capsys):
    rc, _, err = run_dry(overrides, capsys)
    assert rc == 2 and key in err and text in err, err


def test_distillation_goes_with_rewards_agents_async_rollout_and_lora(capsys):
    """The teacher is a role beside the others: a config with rewards (the mix), tools, asynchronous rollout and
    a LoRA student is accepted (the trainer's distillation step reads only the loss mask and the log-probs)."""
    teacher = ["+teacher_config.model=tiny_qwen25", "+teacher_config.load=/somewhere/teacher",
               "+rl_config.teacher_resource.num_npus=1", "+rl_config.distill_coef=0.5"]  # fmt: skip
    from cli import train_ppo

    for name in ("grpo_tiny_cpu", "grpo_tiny_cpu_tools", "grpo_tiny_cpu_async", "dapo_tiny_cpu_async_tools"):
        assert train_ppo.main(["--config-name", name, "dry_run=true"] + teacher) == 0, capsys.readouterr().err
        assert "distill   : teacher tiny_qwen25" in capsys.readouterr().out
    lora = ["actor_config.lora_r=8", "actor_config.lora_alpha=16"]
    assert train_ppo.main(["--config-name", "grpo_tiny_cpu", "dry_run=true"] + teacher + lora) == 0
    assert "LoRA r=8" in capsys.readouterr().out


def test_the_recipe_plans_a_32b_teacher_beside_a_7b_student(capsys):
    from cli import train_ppo

    assert train_ppo.main(["--config-name", "distill_qwen25_32b_to_7b_A3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "teacher   : 16 devices = TP 8 x PP 1 x DP 2; model qwen25_32b" in out
    assert "actor     : 16 devices = TP 4 x PP 1 x DP 4; model qwen25_7b" in out
    assert "clipped to +-10" in out and "throughput world_size=16" in out


# ----- the teacher's tokenizer ---------------------------------------------------------------------------------
def test_a_teacher_with_another_tokenizer_is_refused_with_the_difference(demo_assets, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.startup.preflight import check_teacher_tokenizer
    from mindspeed_rl.utils.cli import UserError

    same = tmp_path / "same"
    shutil.copytree(demo_assets["tokenizer"], same)
    other = tmp_path / "other"
    tokenizer = AutoTokenizer.from_pretrained(demo_assets["tokenizer"])
    tokenizer.add_tokens(["<extra_teacher_token>"])
    tokenizer.save_pretrained(other)

    def config(teacher_tokenizer):
        return load_ppo_config(
            "distill_tiny_cpu",
            [f"megatron_training.tokenizer_name_or_path={demo_assets['tokenizer']}",
             f"+teacher_config.tokenizer_name_or_path={teacher_tokenizer}"],
        )  # fmt: skip

    check_teacher_tokenizer(config(same))  # a copy of the same tokenizer: accepted
    with pytest.raises(UserError) as exc:
        check_teacher_tokenizer(config(other))
    message = str(exc.value)
    assert "teacher_config.tokenizer_name_or_path" in message and "vocabularies differ" in message, message
    assert "'<extra_teacher_token>'" in message


# ----- the trainer's step --------------------------------------------------------------------------------------
def test_the_trainer_mixes_the_teacher_advantage_against_the_sampling_policy():
    """Old log-probs are the student when computed, else the rollout's (one on-policy step skips them)."""
    from types import SimpleNamespace

    from mindspeed_rl.protocol import Experience
    from mindspeed_rl.trainer.ppo.ppo_trainer import PPOTrainer

    rewards = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    exp = Experience(
        prompt_width=2,
        input_ids=torch.zeros(2, 5, dtype=torch.long),
        attention_mask=torch.ones(2, 5, dtype=torch.long),
        response_mask=MASK.clone(),
        rollout_log_probs=STUDENT.clone(),
        teacher_log_probs=TEACHER.clone(),
        advantages=rewards.clone(),
    )
    trainer = SimpleNamespace(
        algorithm=SimpleNamespace(distill=get_distillation("reverse_kl")),
        rl=SimpleNamespace(distill_clip=2.0, distill_coef=0.5),
    )
    metrics = PPOTrainer.add_distillation(trainer, exp)
    # A = A_reward + 0.5 x clip(T - S, -2, 2) = [[1.25, 0.5, 1.0], [-1.5, 0.0, 0.0 (masked)]]
    assert torch.allclose(exp.advantages, torch.tensor([[1.25, 0.5, 1.0], [-1.5, 0.0, 0.0]]))
    # KL row 1: (-0.5 + 1.0 + 0.0) / 3 = 1/6; row 2: (1.0 - 3.0) / 2 = -1.0; mean -5/12
    assert metrics["distill/teacher_kl"] == pytest.approx(-5 / 12)
    assert metrics["distill/advantage_mean"] == pytest.approx((0.5 - 1.0 + 0.0 - 1.0 + 2.0) / 5)
    assert PPOTrainer.add_distillation(SimpleNamespace(algorithm=SimpleNamespace(distill=None)), exp) == {}
