"""The algorithm family against hand-computed values: every registered estimator and policy loss, the
loss aggregation modes (independent of the micro-batch / DP split), KL variants, rollout correction,
DAPO shaping and filtering, and the registry's decisions."""

import inspect
import math
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.algorithms import (
    Clip,
    LossScale,
    aggregate,
    cispo_policy_loss,
    dr_grpo_advantages,
    entropy_loss,
    gmpo_policy_loss,
    grpo_advantages,
    gspo_policy_loss,
    informative_groups,
    kl_penalty,
    mismatch_metrics,
    overlong_penalty,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
    sapo_policy_loss,
    sequence_rewards,
    token_level_rewards,
    truncated_is_weights,
    value_loss,
    vanilla_policy_loss,
)
from mindspeed_rl.algorithms import advantages as advantages_module
from mindspeed_rl.algorithms import losses as losses_module
from mindspeed_rl.config_cls.algorithm_choice import (
    ADVANTAGE_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    AlgorithmChoiceError,
    kl_names,
)
from mindspeed_rl.features.algorithm import resolve_algorithm

T = torch.tensor
MASK = T([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
GROUP = T([0, 0, 1, 1])
SCORES = T([1.0, 0.0, 2.0, 0.0])


# ----- estimators ---------------------------------------------------------------------------------------------
def test_grpo_normalises_by_group_mean_and_std():
    adv, ret = grpo_advantages(SCORES, MASK, GROUP)
    # group 0: mean 0.5, unbiased std sqrt(0.5); group 1: mean 1, std sqrt(2)
    want = T(
        [
            0.5 / (math.sqrt(0.5) + 1e-6),
            -0.5 / (math.sqrt(0.5) + 1e-6),
            1 / (math.sqrt(2) + 1e-6),
            -1 / (math.sqrt(2) + 1e-6),
        ]
    )
    assert torch.allclose(adv[:, 0], want, atol=1e-6)
    assert torch.equal(adv, ret) and adv[1, 1] == 0 and adv[0, 2] == 0  # padding stays 0


def test_dr_grpo_subtracts_the_group_mean_only():
    adv, _ = dr_grpo_advantages(SCORES, MASK, GROUP)
    assert torch.allclose(adv, T([[0.5, 0.5, 0], [-0.5, 0, 0], [1.0, 1.0, 1.0], [-1.0, -1.0, 0]]))


def test_rloo_baseline_is_the_mean_of_the_others():
    scores, group = T([3.0, 1.0, 2.0, 5.0, 5.0]), T([0, 0, 0, 1, 1])
    adv, _ = rloo_advantages(scores, torch.ones(5, 1), group)
    # 3 - (1+2)/2, 1 - (3+2)/2, 2 - (3+1)/2; group 1 equal -> 0
    assert torch.allclose(adv[:, 0], T([1.5, -1.5, 0.0, 0.0, 0.0]))


def test_reinforce_plus_plus_reward_to_go_then_whitened():
    rewards, mask = T([[0.0, 1.0], [0.5, 0.0]]), T([[1, 1], [1, 0]])
    adv, ret = reinforce_plus_plus_advantages(rewards, mask, gamma=0.5)
    assert torch.allclose(ret, T([[0.5, 1.0], [0.5, 0.0]]))  # G_0 = 0 + 0.5 * 1
    g = T([0.5, 1.0, 0.5])
    want = (g - g.mean()) / g.std()
    assert torch.allclose(adv[mask.bool()], want, atol=1e-5) and adv[1, 1] == 0


def test_reinforce_plus_plus_baseline_centres_in_group_then_whitens():
    adv, _ = reinforce_plus_plus_baseline_advantages(SCORES, MASK, GROUP)
    centred = T([0.5, 0.5, -0.5, 1.0, 1.0, 1.0, -1.0, -1.0])  # per valid token, row-major
    want = (centred - centred.mean()) / centred.std()
    assert torch.allclose(adv[MASK.bool()], want, atol=1e-5)


def test_kl_in_the_reward_reaches_group_estimators():
    """The found bug: group_norm with use_kl_in_reward used raw scores. The KL now goes through the
    token rewards, whose sum every sequence estimator reads."""
    mask = torch.ones(2, 2)
    kl = T([[0.0, 0.0], [1.0, 1.0]])
    rewards = token_level_rewards(T([1.0, 1.0]), mask, kl, kl_coef=0.5)
    assert torch.allclose(sequence_rewards(rewards, mask), T([1.0, 0.0]))
    adv, _ = advantages_module.estimate(
        ADVANTAGE_ESTIMATORS["group_norm"],
        token_rewards=rewards,
        sequence_rewards=sequence_rewards(rewards, mask),
        values=None,
        mask=mask,
        group=T([0, 0]),
        gamma=1.0,
        lam=1.0,
        whiten=True,
    )
    assert adv[0, 0] > 0 > adv[1, 0]  # equal scores, the row with the larger KL loses


def test_every_registered_function_exists_reads_known_inputs_and_states_its_formula():
    inputs = {"token_rewards", "sequence_rewards", "values", "mask", "group", "gamma", "lam", "whiten"}
    for name, spec in ADVANTAGE_ESTIMATORS.items():
        fn = getattr(advantages_module, spec.function)
        assert set(inspect.signature(fn).parameters) <= inputs, name
        assert "=" in fn.__doc__, f"{name}: the docstring states the formula"
        assert spec.needs_critic == ("values" in inspect.signature(fn).parameters), name
    for name, spec in POLICY_LOSSES.items():
        fn = getattr(losses_module, spec.function)
        assert "=" in fn.__doc__ and spec.default_agg_mode in LOSS_AGG_MODES, name
    assert ADVANTAGE_ESTIMATORS["grpo"] is ADVANTAGE_ESTIMATORS["group_norm"]


def test_every_estimator_runs_on_a_batch_and_stays_zero_on_padding():
    torch.manual_seed(0)
    mask = T([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    rewards = token_level_rewards(T([1.0, 0.0, 0.5, 1.0]), mask.float())
    for name, spec in ADVANTAGE_ESTIMATORS.items():
        adv, ret = advantages_module.estimate(
            spec,
            token_rewards=rewards,
            sequence_rewards=sequence_rewards(rewards, mask),
            values=torch.randn(4, 4),
            mask=mask,
            group=T([0, 0, 1, 1]),
            gamma=1.0,
            lam=0.95,
            whiten=True,
        )
        assert adv.shape == ret.shape == (4, 4) and torch.isfinite(adv).all(), name
        assert (adv[~mask.bool()] == 0).all() and (ret[~mask.bool()] == 0).all(), name


# ----- aggregation ----------------------------------------------------------------------------------------------
def test_aggregation_modes_by_hand():
    loss = T([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0], [4.0, 5.0, 6.0]])
    mask = T([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(21 / 6)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 3 + 15) / 3)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 3 + 5) / 3)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", LossScale(6, 3, 4)).item() == pytest.approx(21 / 12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_each_mode_is_independent_of_the_micro_batch_and_dp_split(mode):
    torch.manual_seed(1)
    values = torch.randn(8, 6, dtype=torch.float64)
    mask = (torch.rand(8, 6) > 0.4).long()
    mask[3] = 0  # a response without valid tokens
    whole = aggregate(values, mask, mode, LossScale.of(mask, horizon=16))
    scale = LossScale.of(mask, horizon=16)  # what WorkerGroup.update sends every share
    for splits in ([8], [4, 4], [1, 3, 2, 2], [2] * 4, [1] * 8):
        bounds = torch.tensor([0] + splits).cumsum(0)
        shares = sum(aggregate(values[a:b], mask[a:b], mode, scale) for a, b in zip(bounds[:-1], bounds[1:]))
        assert shares.item() == pytest.approx(whole.item(), rel=1e-12), splits


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_nan_and_inf_on_masked_positions_never_reach_loss_or_gradient(mode):
    log_prob = torch.zeros(2, 3, requires_grad=True)
    old = T([[0.1, float("nan"), float("inf")], [0.0, float("-inf"), float("nan")]])
    adv = T([[1.0, float("nan"), float("inf")], [-1.0, float("inf"), 0.0]])
    mask = T([[1, 0, 0], [1, 0, 0]])
    for fn in (getattr(losses_module, spec.function) for spec in POLICY_LOSSES.values()):
        loss, metrics = fn(log_prob, old, adv, mask, Clip(0.2, 0.28, 3.0), mode)
        loss.backward()
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values()), fn.__name__
        assert torch.isfinite(log_prob.grad).all() and (log_prob.grad[:, 1:] == 0).all(), fn.__name__
        log_prob.grad = None
    values = torch.zeros(2, 3, requires_grad=True)
    vloss, _ = value_loss(values, old, adv, mask, 0.5, mode)
    vloss.backward()
    assert torch.isfinite(vloss) and torch.isfinite(values.grad).all()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_a_mini_batch_without_valid_tokens_gives_zero_not_nan(mode):
    lp = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = vanilla_policy_loss(lp, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3), Clip(), mode)
    loss.backward()
    assert loss.item() == 0 and torch.isfinite(lp.grad).all()
    assert entropy_loss(torch.ones(2, 3), torch.zeros(2, 3), mode).item() == 0


# ----- policy losses --------------------------------------------------------------------------------------------
def test_clip_higher_lets_good_tokens_rise_further():
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    lp = T([[math.log(1.25), math.log(1.25)]])
    adv = T([[1.0, -1.0]])
    symmetric, m = vanilla_policy_loss(lp, old, adv, mask, Clip(0.2, 0.2))
    higher, m_high = vanilla_policy_loss(lp, old, adv, mask, Clip(0.2, 0.28))
    # A > 0: min(ratio, 1 + eps_high) -> -1.2 vs -1.25; A < 0: max(1.25, clip) = 1.25 either way
    assert symmetric.item() == pytest.approx((-1.2 + 1.25) / 2)
    assert higher.item() == pytest.approx((-1.25 + 1.25) / 2)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5) and m_high["pg_clipfrac"].item() == 0


def test_dual_clip_bounds_negative_advantages():
    lp, old, mask = T([[math.log(5.0)]]), torch.zeros(1, 1), torch.ones(1, 1)
    loss, m = vanilla_policy_loss(lp, old, T([[-1.0]]), mask, Clip(0.2, 0.2, 3.0))
    assert loss.item() == pytest.approx(3.0) and m["pg_clipfrac_lower"].item() == 1.0


def test_rollout_is_weights_scale_the_token_loss():
    lp, old, adv, mask = torch.zeros(1, 2), torch.zeros(1, 2), T([[1.0, 1.0]]), torch.ones(1, 2)
    loss, _ = vanilla_policy_loss(lp, old, adv, mask, Clip(), weights=T([[0.5, 2.0]]))
    assert loss.item() == pytest.approx((-0.5 - 2.0) / 2)


def test_gspo_uses_the_geometric_mean_ratio_of_each_sequence():
    old = torch.zeros(2, 2)
    lp = T([[math.log(1.1), math.log(1.3)], [math.log(1.5), 0.0]]).requires_grad_()
    adv, mask = T([[1.0, 1.0], [1.0, 1.0]]), T([[1, 1], [1, 0]])
    loss, m = gspo_policy_loss(lp, old, adv, mask, Clip(0.2, 0.2), "seq-mean-token-mean")
    s0 = math.sqrt(1.1 * 1.3)  # 1.1958 < 1.2: inside the clip range
    assert loss.item() == pytest.approx((-s0 + -1.2) / 2, rel=1e-5)  # s1 = 1.5 clipped to 1.2 (A > 0)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)
    loss.backward()
    # loss = (1/2) * (1/2) sum_t -s_{0,t}; d s_{0,t} / d lp_t = s0: every token of sequence 0 gets -s0 / 4
    assert torch.allclose(lp.grad[0], torch.full((2,), -s0 / 4), atol=1e-6)
    assert lp.grad[1].abs().sum() == 0  # clipped: no gradient


def test_cispo_keeps_the_gradient_of_tokens_whose_weight_is_clipped():
    old, mask = torch.zeros(1, 3), torch.ones(1, 3)
    lp = T([[math.log(1.1), math.log(1.5), math.log(0.5)]]).requires_grad_()
    adv = T([[1.0, 1.0, -2.0]])
    loss, m = cispo_policy_loss(lp, old, adv, mask, Clip(0.2, 0.28))
    weights = T([1.1, 1.28, 0.8])  # sg(clip(ratio)): 1.5 -> 1.28, 0.5 -> 0.8
    want = -(weights * adv[0] * lp[0].detach()).sum() / 3
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 3) and m["pg_clipfrac_lower"].item() == pytest.approx(1 / 3)
    loss.backward()
    assert torch.allclose(lp.grad[0], -weights * adv[0] / 3, atol=1e-6)  # every token moves, clipped ones too
    ppo_lp = lp.detach().clone().requires_grad_()
    vanilla_policy_loss(ppo_lp, old, adv, mask, Clip(0.2, 0.28))[0].backward()
    assert ppo_lp.grad[0, 1] == 0 and ppo_lp.grad[0, 2] == 0  # PPO's clip zeroes both
    assert ppo_lp.grad[0, 0].item() == pytest.approx(lp.grad[0, 0].item())  # inside the range: PPO's gradient


def test_sapo_gate_has_ppos_slope_on_policy_and_decays_softly_off_it():
    mask, adv = torch.ones(1, 2), T([[1.0, -1.0]])
    on = torch.zeros(1, 2, requires_grad=True)
    loss, _ = sapo_policy_loss(on, torch.zeros(1, 2), adv, mask, Clip(tau_pos=1.0, tau_neg=1.05))
    assert loss.item() == pytest.approx((-4 / 1.0 * 0.5 + 4 / 1.05 * 0.5) / 2, rel=1e-5)  # f(1) = 2 / tau
    loss.backward()
    ppo = torch.zeros(1, 2, requires_grad=True)
    vanilla_policy_loss(ppo, torch.zeros(1, 2), adv, mask, Clip(), "seq-mean-token-mean")[0].backward()
    assert torch.allclose(on.grad, ppo.grad, atol=1e-6)  # f'(1) = 1: PPO's on-policy gradient
    # ratio 1.5 with A > 0, beyond PPO's clip: f'(r) r = 4 s (1 - s) r with s = sigmoid(tau (r - 1))
    far = T([[math.log(1.5)]]).requires_grad_()
    grads = {}
    for tau in (1.0, 4.0):
        far.grad = None
        sapo_policy_loss(far, torch.zeros(1, 1), T([[1.0]]), torch.ones(1, 1), Clip(tau_pos=tau))[0].backward()
        s = 1 / (1 + math.exp(-tau * 0.5))
        assert far.grad.item() == pytest.approx(-4 * s * (1 - s) * 1.5, rel=1e-5)
        grads[tau] = far.grad.item()
    assert grads[1.0] < grads[4.0] < 0  # a hotter gate (tau 4) lets less through, never nothing


def test_gmpo_takes_the_geometric_mean_of_token_ratios_clipped_in_log_space():
    old = torch.zeros(3, 2)
    l1, l2 = math.log(1.1), math.log(1.5)  # 0.095 inside [-0.2, 0.2], 0.405 outside
    lp = T([[l1, l2], [l2, 0.0], [l2, -l2]]).requires_grad_()
    adv, mask = T([[1.0, 1.0], [1.0, 1.0], [-1.0, -1.0]]), T([[1, 1], [1, 0], [1, 1]])
    loss, m = gmpo_policy_loss(lp, old, adv, mask, Clip(0.2, 0.2))
    r0 = math.exp((l1 + 0.2) / 2)  # A > 0: log ratios above 0.2 are cut to 0.2
    r1 = math.exp(0.2)
    r2 = math.exp((l2 - 0.2) / 2)  # A < 0: only the lower bound binds (0.405 stays, -0.405 -> -0.2)
    assert loss.item() == pytest.approx((-r0 - r1 + r2) / 3, rel=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 5) and m["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    loss.backward()
    # d L_i / d lp_t = -A_i r_i / |o_i| on unclipped tokens, / 3 sequences
    assert lp.grad[0].tolist() == pytest.approx([-r0 / 2 / 3, 0.0], abs=1e-6)
    assert lp.grad[1].abs().sum() == 0
    assert lp.grad[2].tolist() == pytest.approx([r2 / 2 / 3, 0.0], abs=1e-6)
    # rollout-correction weights enter as their geometric mean per sequence
    weighted, _ = gmpo_policy_loss(lp.detach()[:1], old[:1], adv[:1], mask[:1], Clip(0.2, 0.2), weights=T([[0.5, 2.0]]))
    assert weighted.item() == pytest.approx(-r0, rel=1e-6)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_each_policy_loss_is_independent_of_the_micro_batch_split(name):
    fn = getattr(losses_module, POLICY_LOSSES[name].function)
    torch.manual_seed(2)
    old = torch.randn(8, 6, dtype=torch.float64) * 0.1
    lp = old + torch.randn(8, 6, dtype=torch.float64) * 0.3
    adv = torch.randn(8, 1, dtype=torch.float64).expand(8, 6).contiguous()
    mask = (torch.rand(8, 6) > 0.3).long()
    for mode in LOSS_AGG_MODES:
        scale = LossScale.of(mask, horizon=16)
        whole = fn(lp, old, adv, mask, Clip(0.2, 0.28), mode, scale)[0]
        for splits in ([4, 4], [1, 3, 2, 2]):
            bounds = torch.tensor([0] + splits).cumsum(0).tolist()
            parts = [
                fn(lp[a:b], old[a:b], adv[a:b], mask[a:b], Clip(0.2, 0.28), mode, scale)[0]
                for a, b in zip(bounds, bounds[1:])
            ]
            assert sum(parts).item() == pytest.approx(whole.item(), rel=1e-12), (mode, splits)


# ----- KL ----------------------------------------------------------------------------------------------------
def test_verl_kl_names_and_straight_through_variants():
    lp, ref = T([-1.0]), T([-1.5])
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    for name in ("k1+", "k3+", "low_var_kl+"):
        x = T([-1.0], requires_grad=True)
        value = kl_penalty(x, ref, name)
        value.backward()
        assert value.item() == pytest.approx(kl_penalty(lp, ref, name[:-1]).item())  # forward: the estimator
        assert x.grad.item() == pytest.approx(0.5)  # gradient of k2: (log pi - log pi_ref)
    assert set(kl_names()) >= {"k1", "k2", "k3", "k1+", "k3+", "kl", "low_var_kl"}


# ----- rollout correction ---------------------------------------------------------------------------------------
def test_truncated_importance_weights_token_and_sequence():
    old = T([[0.0, math.log(3.0)], [math.log(0.5), 0.0]])
    rollout = torch.zeros(2, 2)
    mask = T([[1, 1], [1, 0]])
    w, m = truncated_is_weights(old, rollout, mask, "token", threshold=2.0)
    assert torch.allclose(w, T([[1.0, 2.0], [0.5, 0.0]]))
    assert m["rollout_correction/is_capped_frac"] == pytest.approx(1 / 3)
    w, _ = truncated_is_weights(old, rollout, mask, "sequence", threshold=2.0)
    assert torch.allclose(w, T([[2.0, 2.0], [0.5, 0.0]]))  # prod 3 capped at 2; 0.5
    metrics = mismatch_metrics(old, rollout, mask)
    rho = T([1.0, 3.0, 0.5])
    assert metrics["rollout_correction/ratio_max"] == pytest.approx(3.0)
    assert metrics["rollout_correction/kl_k3"] == pytest.approx(float((rho - rho.log() - 1).mean()))


# ----- DAPO shaping and filtering -------------------------------------------------------------------------------
def test_overlong_penalty_ramp():
    lengths = T([10, 12, 14, 16, 20])
    penalty = overlong_penalty(lengths, max_tokens=16, buffer=4, factor=1.0)
    assert torch.allclose(penalty, T([0.0, 0.0, -0.5, -1.0, -1.0]))


def test_informative_groups_drop_all_equal_groups():
    keep = informative_groups(T([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), T([0, 0, 1, 1, 2, 2]))
    assert keep.tolist() == [False, False, True, True, False, False]


# ----- the registry's decisions -------------------------------------------------------------------------------
def rl(**kw):
    values = dict(
        adv_estimator="gae",
        n_samples_per_prompt=1,
        policy_loss="vanilla",
        loss_agg_mode=None,
        token_level_loss=None,
        clip_higher_enable=None,
        clip_ratio_low=None,
        clip_ratio_high=None,
        clip_ratio=0.2,
        clip_ratio_c=None,
        tau_pos=None,
        tau_neg=None,
        init_kl_coef=0.0,
        kl_ctrl_type="fixed",
        use_kl_in_reward=False,
        rollout_correction=SimpleNamespace(rollout_is=None),
        distill_coef=0.0,
        distill_loss="reverse_kl",
    )
    values.update(kw)
    return SimpleNamespace(**values)


def test_plan_decides_critic_reference_and_kl_once():
    ppo = resolve_algorithm(rl(init_kl_coef=0.001))
    assert ppo.use_critic and ppo.use_reference and ppo.kl_in_loss and not ppo.kl_in_reward
    assert ppo.distill is None and resolve_algorithm(rl(distill_coef=0.5)).distill.name == "reverse_kl"
    grpo = resolve_algorithm(rl(adv_estimator="grpo", n_samples_per_prompt=8))
    assert not grpo.use_critic and not grpo.use_reference and grpo.estimator.name == "group_norm"
    verl_style = resolve_algorithm(
        rl(adv_estimator="rloo", n_samples_per_prompt=4, use_kl_in_reward=True, init_kl_coef=0.01)
    )
    assert verl_style.kl_in_reward and not verl_style.kl_in_loss and verl_style.use_reference
    dapo = resolve_algorithm(
        rl(
            adv_estimator="group_norm",
            n_samples_per_prompt=8,
            clip_higher_enable=True,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            token_level_loss=True,
        )
    )
    assert (dapo.clip_low, dapo.clip_high, dapo.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert resolve_algorithm(rl(policy_loss="gspo")).loss_agg_mode == "seq-mean-token-mean"
    assert resolve_algorithm(rl(policy_loss="cispo")).loss_agg_mode == "token-mean"
    sapo = resolve_algorithm(rl(policy_loss="sapo", tau_neg=2.0))
    assert (sapo.loss_agg_mode, sapo.tau_pos, sapo.tau_neg) == ("seq-mean-token-mean", 1.0, 2.0)
    assert "gate tau 1 (A > 0) / 2 (A <= 0)" in sapo.describe()
    assert "log-ratio clip [-0.2, 0.2]" in resolve_algorithm(rl(policy_loss="gmpo")).describe()
    with pytest.raises(AlgorithmChoiceError, match="rl_config.clip_ratio_c: the dual clip bounds vanilla and gspo"):
        resolve_algorithm(rl(policy_loss="cispo", clip_ratio_c=3.0))
    with pytest.raises(
        AlgorithmChoiceError, match="rl_config.tau_pos: is SAPO's gate temperature; policy_loss is gmpo"
    ):
        resolve_algorithm(rl(policy_loss="gmpo", tau_pos=1.0))
    assert resolve_algorithm(rl(token_level_loss=False)).loss_agg_mode == "seq-mean-token-mean"
    with pytest.raises(AlgorithmChoiceError, match="n_samples_per_prompt"):
        resolve_algorithm(rl(adv_estimator="dr_grpo"))
    with pytest.raises(AlgorithmChoiceError, match="would vanish"):
        resolve_algorithm(rl(use_kl_in_reward=True))
