"""The rollout service: what the trainer asks of generation, whichever workers run it.

    handle = service.submit(RolloutRequest(prompts, n, seed))   # starts generation, returns at once
    batch = service.collect(handle)                              # waits; outputs with global prompt indices
    service.update_weights(version)                              # the actor's weights after update `version`

Every output records the policy version that generated it (``handle.version``). Implementations:
``ColocatedRollout`` (the integrated actor's own engines, which share its devices: MindSpeed-RL's
integrated mode) and ``DisaggregatedRollout`` (rollout workers on devices of their own, weights pushed
from the actor; a fleet whose engines may fail and restart without failing the run: ``workers/rollout_fleet.py``).
The rollout source (``rollout/source/rollout_source.py``) drives either, whatever its schedule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol

from ..protocol.rollout import GeneratedBatch, RolloutRequest
from ..utils.cli import first_line


class EngineFailed(RuntimeError):
    """A rollout engine passed a deadline, died or answered garbage where the run cannot go on without it; the
    message names the engine, the phase and the key (rl_config.rollout_fault_tolerance)."""


class GeneratingGroup(Protocol):
    """What the service asks of a group of workers that generate (``workers/worker_group.WorkerGroup`` of the
    integrated actor or of the rollout workers; a test's fake): submit and collect, and calls on every rank."""

    def submit_generate(self, request: RolloutRequest, version: Optional[int] = None) -> Any: ...
    def collect_generate(self, pending: Any) -> GeneratedBatch: ...
    def call_async(self, method: str, *args: Any, **kwargs: Any) -> List[Any]: ...


class Fleet(Protocol):
    """What the disaggregated service asks of the rollout workers (``workers/rollout_fleet.RolloutFleet``)."""

    stop_reason: Optional[str]

    def submit_generate(self, request: RolloutRequest, version: Optional[int] = None) -> Any: ...
    def collect_generate(self, pending: Any) -> GeneratedBatch: ...
    def sync_weights(self, actor: Any, version: int, pause_timeout_s: Optional[float], recompute: bool) -> None: ...
    def metrics(self) -> Dict[str, float]: ...


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

    def health_metrics(self) -> Dict[str, float]:
        """The engines' failures, restarts, moved requests and time lost since the last call (a fleet's)."""
        return {}

    @property
    def stop_reason(self) -> Optional[str]:
        """Why the run should save and stop after this iteration (too few engines in service), else None."""
        return None


class ColocatedRollout(RolloutService):
    """The integrated actor's engines: generation runs on the actor's own ranks. A submit with a newer
    version than the engines hold first reshards the actor's weights into them (train TP/PP -> infer TP),
    then offloads the training state; after generation the engines free their memory and the training
    state comes back."""

    def __init__(self, actor_group: GeneratingGroup, generate_timeout_s: float = 3600.0) -> None:
        super().__init__()
        self.actor, self.generate_timeout_s = actor_group, generate_timeout_s

    def submit(self, request: RolloutRequest) -> RolloutHandle:
        return RolloutHandle(request, self.version, self.actor.submit_generate(request, self.version))

    def collect(self, handle: RolloutHandle) -> GeneratedBatch:
        """The engines' answer within the generate deadline; an engine that passes it or dies is named (EngineFailed:
        it lives in the actor's processes, so the run restarts from its last checkpoint, rl_config.max_restarts)."""
        import ray

        pending = handle.pending
        if getattr(pending, "refs", None) is None:  # a group that answers at once (a test's fake)
            return self.actor.collect_generate(pending)
        ready, late = ray.wait(pending.refs, num_returns=len(pending.refs), timeout=self.generate_timeout_s)
        if late:
            raise EngineFailed(
                f"{self._engines_of(pending, late)} did not answer a generate call within "
                f"rl_config.rollout_fault_tolerance.generate_timeout_s = {self.generate_timeout_s:g} s"
            )
        try:
            return self.actor.collect_generate(pending)
        except ray.exceptions.RayActorError as exc:
            dead = [ref for ref in pending.refs if _died(ref)]
            raise EngineFailed(
                f"{self._engines_of(pending, dead)} died during generation ({first_line(exc)})"
            ) from None

    @staticmethod
    def _engines_of(pending, refs) -> str:
        ranks = [rank for rank, ref in enumerate(pending.refs) if ref in refs]
        engines = sorted({e for e, members in enumerate(pending.engines) for rank in ranks if rank in members})
        return f"rollout engine(s) {engines} in the actor's worker(s) of rank {ranks} (colocated)"


def _died(ref) -> bool:
    import ray

    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError:
        return True
    except Exception:
        return False
    return False


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
    """Rollout workers on devices of their own (a fleet of engines). ``update_weights`` streams the actor's weights
    to every engine in service (``rollout/weights/weight_transfer.py``: train TP/PP -> full tensors -> each engine's
    infer TP), restarting first any engine that failed, and returns once all hold them; a submit names the version
    it expects, and a rollout rank holding another refuses it.

    With ``in_flight`` the engines keep generating while the actor trains, and an update reaches them in flight:
    every engine pauses (between two steps, within the deadline), all load the weights, then all resume: no engine
    serves a mix of two versions and none resumes before every one holds the new version. A submit then names no
    version (each token records its own), and ``engine_version`` is what the engines hold."""

    def __init__(self, actor_group: GeneratingGroup, fleet: Fleet, in_flight: Optional[InFlightUpdates] = None) -> None:
        super().__init__()
        self.actor, self.rollout = actor_group, fleet
        self.in_flight = in_flight
        self.engine_version, self.pushed = 0, False  # the first update (the run's start, a resume) always pushes

    def update_weights(self, version: int) -> None:
        if self.in_flight is not None and self.pushed and version % self.in_flight.interval:
            super().update_weights(version)  # the engines keep the weights of the last push
            return
        pause = self.in_flight.pause_timeout_s if self.in_flight is not None else None
        recompute = self.in_flight is not None and self.in_flight.recompute_kv_cache
        self.rollout.sync_weights(self.actor, version, pause, recompute)
        self.engine_version, self.pushed = version, True
        super().update_weights(version)

    def submit(self, request: RolloutRequest) -> RolloutHandle:
        expected = None if self.in_flight is not None else self.version
        return RolloutHandle(request, self.version, self.rollout.submit_generate(request, expected))

    def collect(self, handle: RolloutHandle) -> GeneratedBatch:
        return self.rollout.collect_generate(handle.pending)

    def health_metrics(self) -> Dict[str, float]:
        return self.rollout.metrics()

    @property
    def stop_reason(self) -> Optional[str]:
        return self.rollout.stop_reason
