"""What scores the responses: verifiers with their weights, a reward model or a judge; DAPO's overlong shaping;
the adaptive KL controller's target and horizon."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def check_reward_keys(cfg: PPOConfig) -> None:
    """Something scores the responses: verifiers (with weights; their names resolve in
    trainer/startup/config_names.py), or a reward model."""
    rl = cfg.rl
    if rl.rule_reward and not rl.verifier_function:
        raise ConfigError(
            "rl_config.verifier_function",
            "is empty but rule_reward is true: name at least one "
            "verifier, or set rule_reward false and give a reward_config",
        )
    if len(rl.verifier_function) != len(rl.verifier_weight):
        raise ConfigError(
            "rl_config.verifier_weight",
            f"{len(rl.verifier_weight)} weights for {len(rl.verifier_function)} verifier functions "
            f"{rl.verifier_function}",
        )
    agent_rewards = rl.rollout_function == "openai_agent" and rl.policy_endpoint.require_reward
    if not rl.rule_reward and cfg.reward is None and cfg.judge is None and not rl.distill_coef and not agent_rewards:
        raise ConfigError(
            "rl_config.rule_reward",
            "false, but no reward_config (reward model) nor judge_config is given (nor an outside agent's rewards: "
            "rl_config.policy_endpoint.require_reward): nothing would score the responses",
        )


def check_kl_keys(cfg: PPOConfig) -> None:
    rl = cfg.rl
    if rl.kl_ctrl_type == "adaptive" and (rl.kl_target is None or rl.kl_horizon is None):
        raise ConfigError(
            "rl_config.kl_target" if rl.kl_target is None else "rl_config.kl_horizon",
            "required when kl_ctrl_type is adaptive",
        )


def check_overlong_keys(cfg: PPOConfig) -> None:
    """DAPO's overlong shaping: a buffer inside the longest response."""
    rl, max_tokens = cfg.rl, cfg.generate.sampling_config.max_tokens
    if rl.overlong_buffer_enable:
        length = rl.rollout_max_tokens or max_tokens
        if rl.overlong_buffer < 1 or rl.overlong_buffer >= length:
            raise ConfigError(
                "rl_config.overlong_buffer",
                f"{rl.overlong_buffer} must be between 1 and rollout_max_tokens - 1 = {length - 1}",
            )
        if rl.rollout_max_tokens is not None and rl.rollout_max_tokens > max_tokens:
            raise ConfigError(
                "rl_config.rollout_max_tokens",
                f"{rl.rollout_max_tokens} exceeds generate_config.sampling_config.max_tokens "
                f"{max_tokens}: no response can be that long",
            )


def check(cfg: PPOConfig) -> None:
    check_reward_keys(cfg)
    check_overlong_keys(cfg)
    check_kl_keys(cfg)
