"""The batches of an iteration: the mini-batch divides the responses, each training role's share of a mini-batch is
whole micro-batches (a multiple of PP under VPP), and sampling's min_tokens is at most max_tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from ..config_cls.run_config import role_key

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig


def check_batch_sizes(cfg: PPOConfig) -> None:
    """The mini-batch divides one iteration's responses."""
    rl = cfg.rl
    samples = cfg.samples_per_iteration
    if samples % rl.mini_batch_size:
        raise ConfigError(
            "rl_config.mini_batch_size",
            f"{rl.mini_batch_size} does not divide the prompts per iteration x n_samples_per_prompt = "
            f"{cfg.prompts_per_iteration} x {rl.n_samples_per_prompt} = {samples}",
        )


def check_sampling_keys(cfg: PPOConfig) -> None:
    sampling = cfg.generate.sampling_config
    if sampling.min_tokens > sampling.max_tokens:
        raise ConfigError(
            "generate_config.sampling_config.min_tokens",
            f"{sampling.min_tokens} is above max_tokens {sampling.max_tokens}",
        )


def check_role_micro_batch(role: RoleConfig, mini_batch_size: int) -> None:
    """A training role's share of a mini-batch is whole micro-batches."""
    m = role.megatron
    if role.trains:
        per_rank = mini_batch_size / role.dp
        if mini_batch_size % (m.micro_batch_size * role.dp):
            raise ConfigError(
                role_key(role, "micro_batch_size"),
                f"mini_batch_size {mini_batch_size} over DP {role.dp} gives {per_rank:g} "
                f"samples per rank, not a multiple of micro_batch_size {m.micro_batch_size}",
            )
        micro = mini_batch_size // (m.micro_batch_size * role.dp)
        if m.virtual_stages(role.model.num_layers) > 1 and micro % role.pp:
            raise ConfigError(
                role_key(role, "micro_batch_size"),
                f"{micro} micro-batches per mini-batch and rank; an interleaved pipeline (VPP) runs a multiple of "
                f"PP {role.pp}",
            )


def check(cfg: PPOConfig) -> None:
    check_batch_sizes(cfg)
    check_sampling_keys(cfg)
    for role in cfg.roles:
        check_role_micro_batch(role, cfg.rl.mini_batch_size)
