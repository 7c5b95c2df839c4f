"""The GRPO and DAPO CPU twins (grpo_tiny_cpu, dapo_tiny_cpu) learn the demo task from a random policy, and a
control run without policy updates does not (the suite's one control, conftest's ``control_run``). Same pipeline
as PPO (Ray + megatron-core + vLLM on CPU), no critic; DAPO without reference, with dynamic sampling and overlong
shaping.
"""

import pytest

from tests.helpers import demo_config

ITERATIONS = 12
ACCURACY = "acc_for_ppo_rewards/mean"  # the verifier's mean over every generated response


@pytest.fixture(scope="module")
def assets(tmp_path_factory, demo_assets):
    return str(tmp_path_factory.mktemp("algorithms")), demo_assets


@pytest.mark.slow
def test_grpo_and_dapo_twins_learn_and_the_control_run_does_not(assets, control_run):
    from mindspeed_rl.trainer.launch import train

    root, paths = assets
    grpo = train(demo_config("grpo_tiny_cpu", root, paths, ITERATIONS))
    dapo = train(demo_config("dapo_tiny_cpu", root, paths, ITERATIONS))
    control_best = max(m[ACCURACY] for m in control_run)  # the initial policy, never updated
    assert control_best < 0.2, [m[ACCURACY] for m in control_run]
    for name, history in (("grpo", grpo), ("dapo", dapo)):
        curve = [m[ACCURACY] for m in history]
        assert sum(curve[:2]) / 2 < 0.15, (name, curve)
        assert sum(curve[-3:]) / 3 > control_best + 0.35, (name, curve)
    # the registry decided the workers: no critic anywhere, a reference only where the KL is used
    for m in grpo + dapo:
        assert "critic/vf_loss" not in m and "timing/critic_model" not in m
    assert all("timing/reference_model" in m and m["actor/kl_loss"] > 0 for m in grpo[1:])
    assert all("timing/reference_model" not in m and m["actor/kl_loss"] == 0 for m in dapo)
    # DAPO's pieces ran every iteration
    for m in dapo:
        assert m["dynamic_sampling/kept_groups"] + m["dynamic_sampling/filled_groups"] >= 16
        assert 1 <= m["dynamic_sampling/batches"] <= 4
        assert -0.2 <= m["overlong/penalty_mean"] <= 0
        assert m["rollout_correction/ratio_max"] < 1.01  # engine and trainer agree in fp32


@pytest.mark.slow
def test_a_lora_grpo_twin_learns_the_demo_task(assets):
    """grpo_tiny_cpu with LoRA (r 8 on every projection, lr 5e-3): only the adapters train, the reference is
    the base model (the adapters off), and the policy learns the task from the same random start."""
    from mindspeed_rl.trainer.launch import train

    root, paths = assets
    lora = {"actor_config.lora_r": 8, "actor_config.lora_alpha": 16, "actor_config.lr": 5e-3}
    history = train(demo_config("grpo_tiny_cpu", f"{root}/lora", paths, ITERATIONS, **lora))
    curve = [m[ACCURACY] for m in history]
    assert sum(curve[:2]) / 2 < 0.15 and sum(curve[-3:]) / 3 > 0.45, curve
    assert all(m["actor/kl_loss"] > 0 for m in history[1:])  # the adapters moved the policy off its base
