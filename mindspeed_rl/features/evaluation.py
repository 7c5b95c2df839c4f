"""Benchmark suites during training (eval_config): their response budget against the engines, and the plan's line.
The suites' files and rows are read before the first worker starts (trainer/startup/preflight.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def max_new_tokens(cfg: PPOConfig) -> int:
    ev = cfg.evaluation
    return (ev.max_new_tokens if ev is not None else 0) or cfg.generate.sampling_config.max_tokens


def check(cfg: PPOConfig) -> None:
    ev = cfg.evaluation
    if ev is None:
        return
    room = cfg.generate.max_model_len - cfg.rl.max_prompt_length
    if max_new_tokens(cfg) > room:
        raise ConfigError(
            "eval_config.max_new_tokens",
            f"{max_new_tokens(cfg)}: over generate_config.max_model_len {cfg.generate.max_model_len} less "
            f"rl_config.max_prompt_length {cfg.rl.max_prompt_length} ({room})",
        )


def plan_lines(cfg: PPOConfig) -> List[str]:
    ev = cfg.evaluation
    if ev is None:
        return []
    when = f"every {ev.interval} iterations and after the last" if ev.interval else "after the last iteration"
    temperature = ev.temperature if ev.temperature is not None else (0.0 if ev.n == 1 else 1.0)
    return [
        f"  evaluation: {len(ev.suites)} suite(s) {when}{', and before training' if ev.before_train else ''}; "
        f"n {ev.n}, temperature {temperature:g}, {max_new_tokens(cfg)} new tokens, on the rollout engines between "
        "batches (eval/<suite>/pass@k, maj@k)"
    ]
