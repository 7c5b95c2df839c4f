"""The features of a run in one list, and the loops over it. A feature module may define

    derive(cfg)                 values computed from others (before every check)
    check_role(role)            the rules of one role's keys (every role of a PPO run; a single-role stage's role)
    check(cfg)                  the rules across keys (raise ConfigError naming the key to change)
    plan_lines(cfg)             the batch plan's lines while the feature is on
    preflight(cfg, accelerator) what the feature needs of this device and its libraries (raise UserError)

and the names it resolves for other packages (``partial_chunk``, ``filter_metric_name``, ``LORA_TARGETS``). FEATURES
is the order derive and check run in, which is the order errors are reported in and plan lines printed in."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from . import (
    agent,
    algorithm,
    architecture,
    async_rollout,
    batch_invariant,
    batches,
    context_parallel,
    distillation,
    dynamic_sampling,
    evaluation,
    fault_tolerance,
    fused_kernels,
    judge,
    lora,
    memory,
    packing,
    parallel,
    partial_rollout,
    pipeline,
    placement,
    precision,
    profiling,
    rewards,
    rollout_experts,
    router_replay,
    sequence_lengths,
    tracking,
    training,
    validation,
    vision,
)

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig

FEATURES = (
    precision,  # first: its derived rollout_is decides the algorithm's importance weights
    algorithm,  # then every value that asks which roles run
    profiling,
    agent,
    async_rollout,
    fault_tolerance,
    partial_rollout,
    dynamic_sampling,
    lora,
    router_replay,
    vision,
    batch_invariant,
    packing,
    parallel,
    rollout_experts,  # after parallel: infer TP against the devices first
    context_parallel,
    pipeline,
    architecture,
    batches,  # after the layouts: a role's DP is theirs
    memory,
    fused_kernels,
    training,
    placement,
    sequence_lengths,
    rewards,
    distillation,
    judge,
    validation,
    evaluation,
    tracking,
)


def derive(cfg: PPOConfig) -> None:
    for feature in FEATURES:
        if hasattr(feature, "derive"):
            feature.derive(cfg)


def check_role(role: RoleConfig) -> None:
    for feature in FEATURES:
        if hasattr(feature, "check_role"):
            feature.check_role(role)


def check(cfg: PPOConfig) -> None:
    for feature in FEATURES:
        if hasattr(feature, "check_role"):
            for role in cfg.roles:
                feature.check_role(role)
        if hasattr(feature, "check"):
            feature.check(cfg)


def plan_lines(cfg: PPOConfig) -> List[str]:
    return [line for feature in FEATURES if hasattr(feature, "plan_lines") for line in feature.plan_lines(cfg)]


def preflight(cfg: PPOConfig, accelerator) -> None:
    for feature in FEATURES:
        if hasattr(feature, "preflight"):
            feature.preflight(cfg, accelerator)
