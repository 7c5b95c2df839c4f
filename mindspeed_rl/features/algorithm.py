"""The run's algorithm (advantage estimator, policy loss, KL and entropy terms) resolved from rl_config's names, the
first derived value: every other reads it (the critic is started only when the estimator needs one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..config_cls.algorithm_choice import (
    AlgorithmChoiceError,
    AlgorithmPlan,
    PolicyLoss,
    get_advantage,
    get_distillation,
    get_policy_loss,
)
from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def derive(cfg: PPOConfig) -> None:
    try:
        cfg.algorithm = resolve_algorithm(cfg.rl)
    except AlgorithmChoiceError as exc:
        raise ConfigError(exc.key, exc.message) from None


def skips_old_log_prob(cfg: PPOConfig, off_policy: bool) -> bool:
    """One on-policy step: the old log-probs equal the current ones (taken, detached, in the loss), so the forward
    that computes them is skipped. ``off_policy``: batches may hold older policy versions' tokens."""
    rl, algorithm = cfg.rl, cfg.algorithm
    return (
        rl.epochs == 1
        and cfg.samples_per_iteration == rl.mini_batch_size
        and not algorithm.kl_in_reward
        and not algorithm.rollout_is
        and not off_policy
        and not rl.router_replay  # its mismatch is measured in the old-log-prob forward
        and not cfg.generate.batch_invariant  # the zero-difference check compares against that forward
    )


def resolve_loss_agg_mode(loss_agg_mode: Optional[str], token_level_loss: Optional[bool], policy: PolicyLoss) -> str:
    """``loss_agg_mode`` (verl) wins; MindSpeed-RL's ``token_level_loss`` maps true -> token-mean,
    false -> seq-mean-token-mean; neither: the policy loss's published default."""
    from_flag = None if token_level_loss is None else ("token-mean" if token_level_loss else "seq-mean-token-mean")
    if loss_agg_mode is not None and from_flag is not None and loss_agg_mode != from_flag:
        raise AlgorithmChoiceError(
            "rl_config.token_level_loss",
            f"{str(token_level_loss).lower()} means {from_flag}, but loss_agg_mode is "
            f"{loss_agg_mode}; set only one of them",
        )
    return loss_agg_mode or from_flag or policy.default_agg_mode


def check_loss_keys(rl: Any, policy: PolicyLoss) -> None:
    """Keys a policy loss would ignore are refused: the dual clip outside the clipped surrogates, SAPO's
    temperatures outside SAPO."""
    if rl.clip_ratio_c is not None and not policy.dual_clip:
        raise AlgorithmChoiceError(
            "rl_config.clip_ratio_c", f"the dual clip bounds vanilla and gspo; policy_loss {policy.name} has none"
        )
    for key in ("tau_pos", "tau_neg"):
        if getattr(rl, key) is not None and not policy.gate:
            raise AlgorithmChoiceError(f"rl_config.{key}", f"is SAPO's gate temperature; policy_loss is {policy.name}")


def resolve_algorithm(rl: Any) -> AlgorithmPlan:
    """The plan of an ``rl_config`` (any object with its attributes); AlgorithmChoiceError names the key."""
    estimator = get_advantage(rl.adv_estimator)
    if rl.n_samples_per_prompt < estimator.min_samples_per_prompt:
        raise AlgorithmChoiceError(
            "rl_config.n_samples_per_prompt",
            f"{rl.n_samples_per_prompt}, but adv_estimator {rl.adv_estimator} compares the "
            f"responses of one prompt and needs at least {estimator.min_samples_per_prompt} "
            f"samples per prompt",
        )
    policy = get_policy_loss(rl.policy_loss)
    mode = resolve_loss_agg_mode(rl.loss_agg_mode, rl.token_level_loss, policy)
    given = [k for k in ("clip_ratio_low", "clip_ratio_high") if getattr(rl, k) is not None]
    if rl.clip_higher_enable is False and given:
        raise AlgorithmChoiceError(
            f"rl_config.{given[0]}", "is set but clip_higher_enable is false: set clip_higher_enable true, or remove it"
        )
    if rl.clip_higher_enable and rl.clip_ratio_high is None:
        raise AlgorithmChoiceError("rl_config.clip_ratio_high", "required when clip_higher_enable is true (DAPO: 0.28)")
    check_loss_keys(rl, policy)
    low = rl.clip_ratio_low if rl.clip_ratio_low is not None else rl.clip_ratio
    high = rl.clip_ratio_high if rl.clip_ratio_high is not None else rl.clip_ratio
    beta_used = rl.init_kl_coef > 0 or rl.kl_ctrl_type == "adaptive"
    if rl.use_kl_in_reward and not beta_used:
        raise AlgorithmChoiceError(
            "rl_config.init_kl_coef",
            "is 0 with use_kl_in_reward true: the KL term would vanish; set init_kl_coef "
            "> 0, or use_kl_in_reward false",
        )
    correction = rl.rollout_correction.rollout_is
    correction = None if correction == "off" else correction
    return AlgorithmPlan(
        estimator=estimator,
        policy_loss=policy,
        loss_agg_mode=mode,
        clip_low=low,
        clip_high=high,
        clip_dual=rl.clip_ratio_c,
        tau_pos=1.0 if rl.tau_pos is None else rl.tau_pos,
        tau_neg=1.05 if rl.tau_neg is None else rl.tau_neg,
        kl_in_reward=bool(rl.use_kl_in_reward),
        kl_in_loss=bool(beta_used and not rl.use_kl_in_reward),
        rollout_is=correction,
        distill=get_distillation(rl.distill_loss) if rl.distill_coef > 0 else None,
    )
