"""How the rollout fleet tells a sound engine from a failed one (rl_config.rollout_fault_tolerance): the limits it
holds engines to, whether an answer is garbage, and the health probes of engines that generate."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..protocol import RolloutOutput, RolloutRequest

KEY = "rl_config.rollout_fault_tolerance"


@dataclass(frozen=True)
class FaultLimits:
    """rl_config.rollout_fault_tolerance as the fleet uses it."""

    enabled: bool = False
    generate_timeout_s: float = 3600.0
    weight_sync_timeout_s: float = 600.0
    setup_timeout_s: float = 1800.0
    health_check_interval_s: float = 10.0
    health_check_timeout_s: float = 60.0
    max_restarts_per_engine: int = 3
    min_healthy_engines: int = 1

    @staticmethod
    def of(keys) -> "FaultLimits":
        return FaultLimits(**{name: getattr(keys, name) for name in FaultLimits.__dataclass_fields__})


def answer_problem(
    outputs: Sequence[RolloutOutput], request: RolloutRequest, vocab_size: int, max_tokens: int
) -> Optional[str]:
    """Why an engine's answer to ``request`` is garbage (None when it is sound): every prompt n times, token ids
    inside the vocabulary, one finite log-prob <= 0 per token, no more tokens than the budget (the request's
    sampling's, else ``max_tokens``: generate_config's)."""
    want = sorted(i for i in range(len(request.prompts)) for _ in range(request.n))
    if sorted(out.prompt_index for out in outputs) != want:
        return f"{len(outputs)} answers for {len(request.prompts)} prompt(s) x {request.n}"
    budget = request.sampling.max_tokens if request.sampling is not None else max_tokens
    for out in outputs:
        ids = out.response_ids
        if any(not 0 <= int(token) < vocab_size for token in ids):
            return f"token ids outside the vocabulary of {vocab_size} (e.g. {max(ids)})"
        if len(out.logprobs) != len(ids) or any(not (math.isfinite(lp) and lp <= 1e-3) for lp in out.logprobs):
            return "log-probs that are not one finite value <= 0 per token"
        if len(ids) > budget:
            return f"{len(ids)} tokens past the budget of {budget}"
    return None


def settled(refs: List[Any], timeout: Optional[float]) -> Set[Any]:
    """The references among ``refs`` whose calls have ended (answered or failed) within ``timeout`` seconds (0: as
    they stand), ready wherever their answer lies."""
    import ray

    if not refs:
        return set()
    return set(ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)[0])


class Probes:
    """Health probes of the engines generating a request: one outstanding per engine, sent every
    health_check_interval_s; ``check`` tells the seconds an unanswered probe has waited past health_check_timeout_s."""

    def __init__(self, limits: FaultLimits):
        self.limits = limits
        self.sent: Dict[int, Tuple[List[Any], float]] = {}
        self.last: Dict[int, float] = {}

    def check(self, engine) -> Optional[float]:

        now, key = time.monotonic(), id(engine)
        if key in self.sent:
            refs, at = self.sent[key]
            if settled(refs, 0).issuperset(refs):
                del self.sent[key]
                self.last[key] = now
            elif now - at > self.limits.health_check_timeout_s:
                return self.limits.health_check_timeout_s
            return None
        if now - self.last.get(key, 0.0) >= self.limits.health_check_interval_s:
            self.sent[key] = (engine.group.call_async("health"), now)
        return None

    def forget(self, engine) -> None:
        self.sent.pop(id(engine), None)
        self.last.pop(id(engine), None)
