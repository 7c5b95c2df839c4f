"""PPO math against hand-computed values."""

import math

import pytest
import torch

from mindspeed_rl.algorithms import (
    AdaptiveKLController,
    Clip,
    FixedKLController,
    aggregate_token_mean,
    compute_gae,
    entropy_loss,
    group_norm_advantages,
    kl_penalty,
    masked_whiten,
    token_level_rewards,
    value_loss,
    vanilla_policy_loss,
)


def policy_loss(lp, old, adv, mask, clip_ratio, clip_ratio_c=None):
    return vanilla_policy_loss(lp, old, adv, mask, Clip(clip_ratio, clip_ratio, clip_ratio_c))


T = torch.tensor


def test_gae_gamma1_lam1_is_reward_to_go_minus_value():
    adv, ret = compute_gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1, 1, 1]]), 1.0, 1.0)
    assert torch.allclose(adv, T([[0.5, 0.4, 0.3]]))
    assert torch.allclose(ret, T([[1.0, 1.0, 1.0]]))


def test_gae_discounted_by_hand():
    adv, _ = compute_gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1, 1, 1]]), 0.9, 0.5)
    # delta2 = 0.3; delta1 = 0.9*0.7-0.6 = 0.03; delta0 = 0.9*0.6-0.5 = 0.04; gamma*lam = 0.45
    assert torch.allclose(adv, T([[0.04 + 0.45 * 0.165, 0.03 + 0.45 * 0.3, 0.3]]))


def test_gae_ignores_padding_after_the_response():
    adv, ret = compute_gae(T([[0.0, 1.0, 0.0]]), T([[0.5, 0.6, 9.0]]), T([[1, 1, 0]]), 1.0, 1.0)
    assert torch.allclose(adv, T([[0.5, 0.4, 0.0]])) and torch.allclose(ret, T([[1.0, 1.0, 0.0]]))


def test_token_level_rewards_score_on_last_token_and_kl():
    r = token_level_rewards(T([2.0]), T([[1, 1, 0]]), kl=T([[0.1, 0.2, 0.3]]), kl_coef=0.5)
    assert torch.allclose(r, T([[-0.05, 1.9, 0.0]]))
    assert torch.allclose(token_level_rewards(T([1.0, 3.0]), T([[1, 0], [1, 1]])), T([[1.0, 0.0], [0.0, 3.0]]))


def test_kl_estimators():
    lp, ref = T([-1.0]), T([-1.5])
    assert kl_penalty(lp, ref, "kl").item() == pytest.approx(0.5)
    assert kl_penalty(ref, lp, "abs").item() == pytest.approx(0.5)
    assert kl_penalty(lp, ref, "mse").item() == pytest.approx(0.125)
    assert kl_penalty(lp, ref, "low_var_kl").item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert kl_penalty(lp, lp, "low_var_kl").item() == 0.0
    with pytest.raises(ValueError):
        kl_penalty(lp, ref, "nope")


def test_kl_controllers():
    fixed = FixedKLController(0.1)
    fixed.update(5.0, 10)
    assert fixed.value == 0.1
    adaptive = AdaptiveKLController(0.1, target=0.05, horizon=100)
    adaptive.update(0.1, n_steps=10)  # error clipped to +0.2
    assert adaptive.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    adaptive.update(0.045, n_steps=100)  # error -0.1
    assert adaptive.value == pytest.approx(0.102 * 0.9)
    state = adaptive.state_dict()
    other = AdaptiveKLController(1.0, 0.05, 100)
    other.load_state_dict(state)
    assert other.value == adaptive.value


def test_policy_loss_clipping_and_dual_clip():
    old = T([[0.0, 0.0, 0.0]])
    lp = T([[math.log(1.5), math.log(0.5), math.log(5.0)]])
    adv = T([[1.0, -1.0, -1.0]])
    mask = T([[1, 1, 1]])
    loss, m = policy_loss(lp, old, adv, mask, clip_ratio=0.2)
    # token losses: max(-1.5, -1.2) = -1.2; max(0.5, 0.8) = 0.8; max(5, 1.2) = 5
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 5.0) / 3)
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 3)
    assert m["ppo_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(5.0)) / 3)
    dual, _ = policy_loss(lp, old, adv, mask, clip_ratio=0.2, clip_ratio_c=3.0)
    assert dual.item() == pytest.approx((-1.2 + 0.8 + 3.0) / 3)


def test_policy_gradient_sign():
    lp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(lp, torch.zeros(1, 2), T([[1.0, -1.0]]), T([[1, 1]]), 0.2)
    loss.backward()
    assert lp.grad[0, 0] < 0 < lp.grad[0, 1]  # descent raises good tokens, lowers bad ones


def test_value_loss_clipped():
    loss, m = value_loss(T([[1.0, 0.2]]), T([[0.0, 0.0]]), T([[2.0, 0.1]]), T([[1, 1]]), cliprange_value=0.5)
    assert loss.item() == pytest.approx((0.5 * 2.25 + 0.5 * 0.01) / 2)
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)


def test_token_mean_shares_add_up_across_micro_batches():
    x, mask = torch.randn(6, 5), (torch.rand(6, 5) > 0.3).float()
    total = aggregate_token_mean(x, mask)
    n = float(mask.sum())
    shares = sum(aggregate_token_mean(x[i : i + 2], mask[i : i + 2], n) for i in range(0, 6, 2))
    assert shares.item() == pytest.approx(total.item(), rel=1e-5, abs=1e-6)
    assert entropy_loss(x, mask).item() == pytest.approx(total.item())


def test_whitening_and_group_norm():
    w = masked_whiten(T([[1.0, 2.0, 3.0, 4.0]]), T([[1, 1, 1, 1]]))
    assert torch.allclose(w, (T([[1.0, 2.0, 3.0, 4.0]]) - 2.5) / math.sqrt(5 / 3), atol=1e-6)
    adv, ret = group_norm_advantages(T([1.0, 0.0, 1.0, 1.0]), T([[1, 1], [1, 0], [1, 1], [1, 1]]), [0, 0, 1, 1])
    # group 0: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / sqrt(0.5); group 1: equal scores -> 0
    assert torch.allclose(adv[:, 0], T([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0, 0.0]), atol=1e-4)
    assert adv[1, 1] == 0 and torch.equal(adv, ret)


# ----- multi-turn trajectories: tool results are holes in the loss mask ------------------------------------
# tokens:  g0 g1 [t2 t3] g4 g5   (t: a tool result, loss_mask 0), reward 1 on g5, gamma 0.5
HOLE_MASK = torch.tensor([[1, 1, 0, 0, 1, 1]])
HOLE_REWARDS = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])


def test_reinforce_plus_plus_returns_carry_across_tool_results_undiscounted():
    from mindspeed_rl.algorithms.advantages import reinforce_plus_plus_advantages

    # by hand: G5 = 1, G4 = 0.5, g1 and g0 are 2 and 3 policy tokens before the reward: 0.25, 0.125;
    # the holes carry G4 (0) in the returns tensor only as 0 (masked)
    _, returns = reinforce_plus_plus_advantages(HOLE_REWARDS, HOLE_MASK, gamma=0.5)
    assert torch.allclose(returns, torch.tensor([[0.125, 0.25, 0.0, 0.0, 0.5, 1.0]]))
    # the same trajectory without the tool result gives the same returns on the policy's tokens
    _, plain = reinforce_plus_plus_advantages(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.ones(1, 4), gamma=0.5)
    assert torch.allclose(returns[HOLE_MASK.bool()], plain.flatten())


def test_gae_skips_tool_results_consistently():
    from mindspeed_rl.algorithms.advantages import compute_gae

    values = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4]])  # values on the holes must never be read
    adv, returns = compute_gae(HOLE_REWARDS, values, HOLE_MASK, gamma=0.5, lam=0.5)
    # by hand over g0 g1 g4 g5 with V = .1 .2 .3 .4:
    # d5 = 1 - .4 = .6;             A5 = .6
    # d4 = 0 + .5*.4 - .3 = -.1;    A4 = -.1 + .25*.6 = .05
    # d1 = 0 + .5*.3 - .2 = -.05;   A1 = -.05 + .25*.05 = -.0375
    # d0 = 0 + .5*.2 - .1 = 0;      A0 = 0 + .25*(-.0375) = -.009375
    assert torch.allclose(adv, torch.tensor([[-0.009375, -0.0375, 0.0, 0.0, 0.05, 0.6]]))
    assert torch.allclose(returns, torch.tensor([[0.090625, 0.1625, 0.0, 0.0, 0.35, 1.0]]))
    plain_adv, _ = compute_gae(
        torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.tensor([[0.1, 0.2, 0.3, 0.4]]), torch.ones(1, 4), gamma=0.5, lam=0.5
    )
    assert torch.allclose(adv[HOLE_MASK.bool()], plain_adv.flatten())


def test_token_rewards_put_the_score_on_the_last_generated_token():
    from mindspeed_rl.algorithms.advantages import token_level_rewards

    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 0]])  # ends in a cut tool result: the score goes on token 5
    assert token_level_rewards(torch.tensor([2.0]), mask).tolist() == [[0, 0, 0, 0, 0, 2.0, 0, 0]]


# ----- three points where we follow verl ---------------------------------------------------------------------------
def test_the_adaptive_controller_is_fed_the_mean_of_per_response_means():
    """A 4-token response with KL 1 and a 1-token response with KL 3: verl's current_kl is (1 + 3) / 2 = 2,
    not the token mean 7 / 5."""
    from mindspeed_rl.algorithms.kl import controller_kl

    kl = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert controller_kl(kl, mask) == pytest.approx(2.0)
    ctrl = AdaptiveKLController(0.1, target=1.0, horizon=10)
    ctrl.update(controller_kl(kl, mask), 2)
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 2 / 10))


def test_an_empty_response_keeps_its_score_in_the_group_statistics():
    """DAPO's acc_for_dapo gives -1 to an empty answer; with no token to carry it the score used to become 0."""
    from mindspeed_rl.algorithms.advantages import estimate, sequence_rewards
    from mindspeed_rl.config_cls.algorithm_choice import ADVANTAGE_ESTIMATORS

    scores = torch.tensor([1.0, -1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])  # the third response is empty
    rewards = token_level_rewards(scores, mask)
    assert sequence_rewards(rewards, mask).tolist() == [1.0, -1.0, 0.0]  # without the scores: dropped
    seq = sequence_rewards(rewards, mask, scores)
    assert seq.tolist() == [1.0, -1.0, -1.0]
    adv, _ = estimate(
        ADVANTAGE_ESTIMATORS["group_norm"],
        token_rewards=rewards,
        sequence_rewards=seq,
        values=None,
        mask=mask,
        group=torch.tensor([0, 0, 0]),
        gamma=1.0,
        lam=1.0,
        whiten=True,
    )
    mean, std = seq.mean(), seq.std()
    assert adv[0, 0].item() == pytest.approx(((1.0 - mean) / (std + 1e-6)).item(), rel=1e-4)
    assert adv[2].abs().sum() == 0  # no token of the empty response is trained


def test_rollout_mismatch_kl_k1_is_kl_of_rollout_to_trainer_positive_in_expectation():
    from mindspeed_rl.algorithms.rollout_correction import mismatch_metrics

    torch.manual_seed(0)
    rollout = torch.log_softmax(torch.randn(4000, 5), -1)
    trainer = torch.log_softmax(torch.randn(4000, 5) * 0.5 + rollout, -1)
    tokens = torch.multinomial(rollout.exp(), 1)  # sampled by the rollout policy
    rollout_lp, trainer_lp = rollout.gather(1, tokens).T, trainer.gather(1, tokens).T
    metrics = mismatch_metrics(trainer_lp, rollout_lp, torch.ones_like(rollout_lp))
    exact = (rollout.exp() * (rollout - trainer)).sum(1).mean().item()  # KL(rollout || trainer)
    assert metrics["rollout_correction/kl_k1"] > 0 and metrics["rollout_correction/kl_k1"] == pytest.approx(
        exact, rel=0.15
    )


def test_bradley_terry_loss_and_its_gradient_by_hand():
    from mindspeed_rl.algorithms import bradley_terry_loss, preference_metrics

    chosen = torch.tensor([2.0, 0.0, -1.0, 50.0], requires_grad=True)
    rejected = torch.tensor([1.0, 0.0, 1.0, -50.0])
    loss = bradley_terry_loss(chosen, rejected)
    gap = torch.tensor([1.0, 0.0, -2.0, 100.0])
    assert torch.allclose(loss, -torch.log(torch.sigmoid(gap)), atol=1e-6)  # softplus(-gap), finite at gap 100
    loss.sum().backward()
    assert torch.allclose(chosen.grad, torch.sigmoid(gap) - 1, atol=1e-6)  # d/dr_c = -(1 - sigmoid(gap))
    margin = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.allclose(bradley_terry_loss(chosen, rejected, margin)[0], torch.log(torch.tensor(2.0)))
    m = preference_metrics(chosen.detach(), rejected)
    assert m["accuracy"] == 0.5 and m["margin_mean"] == pytest.approx(99.0 / 4)  # a tie counts as wrong


def test_pass_at_k_equals_a_brute_force_count_and_maj_at_k_votes():
    """pass@k against every k-subset of each problem's samples counted by hand; maj@k on a fixed set."""
    import itertools

    from mindspeed_rl.algorithms.sample_metrics import maj_at_k, pass_at_k

    correct = torch.tensor(
        [[0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [1, 1, 1, 0, 1], [1, 1, 1, 1, 1]], dtype=torch.bool
    )
    for k in range(1, 6):
        brute = [
            sum(any(row[j] for j in subset) for subset in itertools.combinations(range(5), k))
            / len(list(itertools.combinations(range(5), k)))
            for row in correct.tolist()
        ]
        assert pass_at_k(correct, k).tolist() == pytest.approx(brute, abs=1e-12), k
    assert pass_at_k(correct, 1).tolist() == pytest.approx([0.0, 0.2, 0.4, 0.8, 1.0])
    answers = torch.tensor([[3, 3, 5, 5, 5], [7, -1, -1, -1, 2], [4, 4, 4, 9, 9]])
    right = answers == torch.tensor([[5], [7], [9]])
    assert maj_at_k(answers, right, 5).tolist() == [True, True, False]  # a tie of none (-1) does not win
    assert maj_at_k(answers, right, 2).tolist() == [False, True, False]
    assert maj_at_k(answers, right, 1).tolist() == right[:, 0].tolist()
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(correct, 6)
