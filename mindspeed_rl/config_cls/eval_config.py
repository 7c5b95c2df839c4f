"""The ``eval_config`` section: benchmark suites evaluated during training (docs/evaluation.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, List, Optional

from .base import ConfigError, opt


@dataclass
class EvalConfig:
    """Suites evaluated with an iteration's weights: on the rollout engines, or on engines of their own."""

    suites: List[str] = opt(
        doc="[NAME=]PATH of each suite: a data file or a suite YAML (as cli/evaluate.py's --suite).", factory=list
    )
    interval: int = opt(0, "Evaluate every this many iterations and after the last one (0: after the last only).", ge=0)
    before_train: bool = opt(False, "Evaluate the starting weights too (logged at the starting iteration).")
    n: int = opt(1, "Samples per problem.", ge=1)
    k: List[int] = opt(doc="k of pass@k and maj@k (default: 1, 2, 4, ... up to n, and n).", factory=list)
    temperature: Optional[float] = opt(None, "Sampling temperature (default: 0, greedy, for n 1; else 1.0).", ge=0)
    top_p: float = opt(1.0, "Nucleus sampling mass.", gt=0, le=1)
    max_new_tokens: int = opt(0, "Most new tokens per response (0: generate_config.sampling_config.max_tokens).", ge=0)
    prompt_type: str = opt("qwen_r1", "Chat template of the suites that name none (the run's preprocessing one).")
    limit: int = opt(0, "The first this many problems of each suite (0: all).", ge=0)
    engines: str = opt(
        "rollout",
        "rollout: the rollout engines between batches (training waits); own: engines of their own on num_devices "
        "more devices, each checkpoint saved at an interval (its save_hf folder) evaluated while training goes on.",
        choices=("rollout", "own"),
    )
    num_devices: int = opt(1, "engines own: devices of the evaluation engine (its tensor-parallel size).", ge=1)

    def check(self, path: str = "eval_config", given: AbstractSet[str] = frozenset()) -> None:
        if not self.suites:
            raise ConfigError(f"{path}.suites", "at least one suite (a data file or a suite YAML)")
        bad = [k for k in self.k if not 1 <= k <= self.n]
        if bad:
            raise ConfigError(f"{path}.k", f"{bad[0]}: each k between 1 and n ({self.n}): pass@k draws k of n samples")
        if self.n > 1 and self.temperature == 0:
            raise ConfigError(f"{path}.temperature", f"0 with n {self.n}: greedy samples are all the same")
