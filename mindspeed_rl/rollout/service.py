"""The rollout service: what the trainer asks of generation, whichever workers run it.

    handle = service.submit(RolloutRequest(prompts, n, seed))   # starts generation, returns at once
    batch = service.collect(handle)                              # waits; outputs with global prompt indices
    service.update_weights(version)                              # the actor's weights after update `version`

Every output records the policy version that generated it (``handle.version``). Implementations:
``ColocatedRollout`` (the integrated actor's own engines, which share its devices: MindSpeed-RL's
integrated mode) and ``DisaggregatedRollout`` (rollout workers on devices of their own, weights pushed
from the actor). The rollout source (``rollout/source/rollout_source.py``) drives either, whatever its schedule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional, Protocol

from ..protocol.rollout import GeneratedBatch, RolloutRequest


class GeneratingGroup(Protocol):
    """What the service asks of a group of workers that generate (``workers/worker_group.WorkerGroup`` of the
    integrated actor or of the rollout workers; a test's fake): submit and collect, and calls on every rank."""

    def submit_generate(self, request: RolloutRequest, version: Optional[int] = None) -> Any: ...
    def collect_generate(self, pending: Any) -> GeneratedBatch: ...
    def call_async(self, method: str, *args: Any, **kwargs: Any) -> List[Any]: ...


@dataclass
class RolloutHandle:
    """A submitted request: the policy version generating it, and the implementation's in-flight state."""

    request: RolloutRequest
    version: int
    pending: Any


class RolloutService(ABC):
    """Generation as a service of the driver. ``version`` is the policy version of the weights the engines
    generate with from the next submit on."""

    def __init__(self) -> None:
        self.version = 0

    @abstractmethod
    def submit(self, request: RolloutRequest) -> RolloutHandle:
        """Start generating ``request``; returns without waiting."""

    @abstractmethod
    def collect(self, handle: RolloutHandle) -> GeneratedBatch:
        """Wait for a submitted request: outputs with global prompt indices, grouped by prompt."""

    def update_weights(self, version: int) -> None:
        """The actor has weights of ``version``: generations submitted from now on use them."""
        self.version = version

    def generate(self, request: RolloutRequest) -> GeneratedBatch:
        return self.collect(self.submit(request))


class ColocatedRollout(RolloutService):
    """The integrated actor's engines: generation runs on the actor's own ranks. A submit with a newer
    version than the engines hold first reshards the actor's weights into them (train TP/PP -> infer TP),
    then offloads the training state; after generation the engines free their memory and the training
    state comes back."""

    def __init__(self, actor_group: GeneratingGroup) -> None:
        super().__init__()
        self.actor = actor_group

    def submit(self, request: RolloutRequest) -> RolloutHandle:
        return RolloutHandle(request, self.version, self.actor.submit_generate(request, self.version))

    def collect(self, handle: RolloutHandle) -> GeneratedBatch:
        return self.actor.collect_generate(handle.pending)


@dataclass(frozen=True)
class InFlightUpdates:
    """How new weights reach engines whose requests are in flight (rl_config.async_training)."""

    interval: int = 1  # push after every k-th update
    recompute_kv_cache: bool = False
    pause_timeout_s: float = 60.0

    @staticmethod
    def of(keys) -> "Optional[InFlightUpdates]":
        if not keys.in_flight_weight_updates:
            return None
        return InFlightUpdates(
            keys.update_weights_interval, keys.recompute_kv_cache_after_weight_updates, keys.pause_timeout_s
        )


class DisaggregatedRollout(RolloutService):
    """Rollout workers on devices of their own. ``update_weights`` streams the actor's weights to every
    rollout rank over the weight channel (``rollout/weights/weight_transfer.py``: train TP/PP -> full tensors -> each
    engine's infer TP) and returns once all hold them; a submit names the version it expects, and a rollout
    rank holding another refuses it.

    With ``in_flight`` the engines keep generating while the actor trains, and an update reaches them in flight:
    every engine pauses (between two steps, within the deadline), all load the weights, then all resume: no engine
    serves a mix of two versions and none resumes before every one holds the new version. A submit then names no
    version (each token records its own), and ``engine_version`` is what the engines hold."""

    def __init__(
        self, actor_group: GeneratingGroup, rollout_group: GeneratingGroup, in_flight: Optional[InFlightUpdates] = None
    ) -> None:
        super().__init__()
        self.actor, self.rollout = actor_group, rollout_group
        self.in_flight = in_flight
        self.engine_version, self.pushed = 0, False  # the first update (the run's start, a resume) always pushes

    def update_weights(self, version: int) -> None:
        import ray

        if self.in_flight is not None and self.pushed and version % self.in_flight.interval:
            super().update_weights(version)  # the engines keep the weights of the last push
            return
        if self.in_flight is not None:
            self._pause(self.in_flight.pause_timeout_s)
        sending = self.actor.call_async("push_weights")
        receiving = self.rollout.call_async("receive_weights", version)
        ray.get(sending + receiving)
        if self.in_flight is not None:
            ray.get(self.rollout.call_async("resume_generation", self.in_flight.recompute_kv_cache))
        self.engine_version, self.pushed = version, True
        super().update_weights(version)

    def _pause(self, timeout: float) -> None:
        """Every engine paused, within the deadline (the worker names an engine that is not; a worker that does not
        answer at all is named here)."""
        import ray

        refs = self.rollout.call_async("pause_generation", timeout)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout + 30.0)
        if len(ready) < len(refs):
            late = [rank for rank, ref in enumerate(refs) if ref not in ready]
            raise RuntimeError(
                f"rollout ranks {late} did not answer the pause for the weight update within "
                f"rl_config.async_training.pause_timeout_s = {timeout:g} s (+ 30 s)"
            )
        ray.get(refs)  # raises the worker's PauseTimeout, which names the engine

    def submit(self, request: RolloutRequest) -> RolloutHandle:
        expected = None if self.in_flight is not None else self.version
        return RolloutHandle(request, self.version, self.rollout.submit_generate(request, expected))

    def collect(self, handle: RolloutHandle) -> GeneratedBatch:
        return self.rollout.collect_generate(handle.pending)
