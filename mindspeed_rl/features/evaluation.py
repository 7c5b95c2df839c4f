"""Benchmark suites during training (eval_config): their response budget against the engines, and the plan's line.
The suites' files and rows are read before the first worker starts (trainer/startup/preflight.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def sampling_temperature(temperature: Optional[float], n: int) -> float:
    """The evaluation's temperature: the one given, else greedy for one sample per problem and 1.0 for several."""
    return temperature if temperature is not None else (0.0 if n == 1 else 1.0)


def max_new_tokens(cfg: PPOConfig) -> int:
    ev = cfg.evaluation
    return (ev.max_new_tokens if ev is not None else 0) or cfg.generate.sampling_config.max_tokens


def eval_devices(cfg: PPOConfig) -> int:
    """Devices of evaluation's own engine (eval_config.engines own), after every other role's; 0 without it."""
    ev = cfg.evaluation
    return ev.num_devices if ev is not None and ev.engines == "own" else 0


def check(cfg: PPOConfig) -> None:
    ev = cfg.evaluation
    if ev is None:
        return
    am = cfg.actor.megatron
    if ev.engines == "own":  # it evaluates the saved checkpoints' HF folders
        if not am.save or not am.save_hf:
            raise ConfigError(
                "actor_config.save_hf",
                "eval_config.engines own evaluates each saved HF folder: set "
                "actor_config.save and save_hf: true (or engines rollout)",
            )
        if ev.before_train:
            raise ConfigError(
                "eval_config.before_train", "engines own evaluates saved checkpoints: none before training"
            )
        if ev.interval and ev.interval % am.save_interval:
            raise ConfigError(
                "eval_config.interval",
                f"{ev.interval}: engines own evaluates saved checkpoints, a multiple of save_interval "
                f"{am.save_interval} is needed",
            )
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
    temperature = sampling_temperature(ev.temperature, ev.n)
    where = (
        f"on an engine of its own ({ev.num_devices} device(s)), each checkpoint saved then, while training goes on"
        if ev.engines == "own"
        else "on the rollout engines between batches"
    )
    return [
        f"  evaluation: {len(ev.suites)} suite(s) {when}{', and before training' if ev.before_train else ''}; "
        f"n {ev.n}, temperature {temperature:g}, {max_new_tokens(cfg)} new tokens, {where} "
        "(eval/<suite>/pass@k, maj@k)"
    ]
