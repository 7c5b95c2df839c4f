"""The rollout engines of the disaggregated layout as a fleet: each engine a worker group of its own (its own
torch.distributed world and weight channel), so that one can fail, leave service and restart while the others serve.

    pending = fleet.submit_generate(request)     # prompts split over the engines in service
    batch = fleet.collect_generate(pending)      # within the deadlines, the engines' health probed meanwhile
    fleet.sync_weights(actor, version)           # restarts what is out of service, then streams the weights
    fleet.metrics()                              # failures, restarts, requests moved, time lost since the last call

The deadlines (rl_config.rollout_fault_tolerance) hold always: a generate call, a weight sync and an engine's start
each end within theirs. Without ``enabled``, an engine that passes one, dies or answers garbage stops the run with
one line naming the engine, the phase and the key (``EngineFailed``; a death is Ray's error, as for any worker).
With it the engine is killed and leaves service, its part of the request goes to the healthy engines (the same
global seeds: the samples the run without the fault would have drawn, where sampling is seeded), and it restarts at
the next weight sync, holding that version's weights before it serves again. Below ``min_healthy_engines`` the fleet
says so (``stop_reason``): the trainer ends its iteration, saves and exits.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..protocol import GeneratedBatch, RolloutOutput, RolloutRequest, slowest
from ..rollout.service import EngineFailed
from ..utils.cli import first_line
from .engine_health import KEY, FaultLimits, Probes, answer_problem
from .worker_group import PendingGeneration, WorkerGroup, engine_prompt_split


@dataclass
class Engine:
    """One engine of the fleet: its worker group, which start it is, whether it serves."""

    index: int
    group: WorkerGroup
    serving: bool = True  # takes requests: started, holds the current weights, not failed
    down: bool = False  # its current start failed and was killed
    restarts: int = 0  # which start it is (0: the run's first)


@dataclass
class Part:
    """A contiguous range of a request's prompts, submitted to one engine."""

    first: int  # the request's first prompt of this part
    request: RolloutRequest
    engine: Engine
    pending: PendingGeneration
    submitted: float


@dataclass
class FleetPending:
    request: RolloutRequest
    version: Optional[int]
    parts: List[Part]
    moved: List[Tuple[int, RolloutRequest]] = field(default_factory=list)  # parts waiting for an engine


@dataclass
class Counts:
    failures: int = 0
    restarts: int = 0
    moved_samples: int = 0
    time_lost_s: float = 0.0


class RolloutFleet:
    """The engines of the rollout workers (see the module docstring). ``respawn(engine, restarts)`` starts an
    engine's ranks anew (a WorkerGroup, built or still building); ``connect(actor, engine, transfer)`` opens its
    weight channel with the actor (within ``setup_timeout_s``); None for both: no restart (tests)."""

    def __init__(
        self,
        groups: List[WorkerGroup],
        limits: FaultLimits = FaultLimits(),
        vocab_size: int = 2**31 - 1,
        max_tokens: int = 2**31 - 1,
        respawn: Optional[Callable[[int, int], WorkerGroup]] = None,
        connect: Optional[Callable[[Any, "Engine"], None]] = None,
    ):
        self.engines = [Engine(index, group) for index, group in enumerate(groups)]
        self.limits, self.vocab_size, self.max_tokens = limits, vocab_size, max_tokens
        self.respawn, self.connect = respawn, connect
        self.counts = Counts()
        self.stop_reason: Optional[str] = None
        self.lock = threading.Lock()  # the trainer's weight sync and the production thread's collect

    # ----- state ------------------------------------------------------------------------------------
    def serving(self) -> List[Engine]:
        with self.lock:
            return [engine for engine in self.engines if engine.serving]

    def describe(self) -> str:
        return ", ".join(
            f"engine {e.index}: ranks {[e.index * len(e.group.handles) + r for r in range(len(e.group.handles))]}"
            for e in self.engines
        )

    def metrics(self) -> Dict[str, float]:
        """The counts since the last call (``fleet/engines_in_service``: now)."""
        counts, self.counts = self.counts, Counts()
        return {
            "fleet/engines_in_service": float(len(self.serving())),
            "fleet/engine_failures": float(counts.failures),
            "fleet/engine_restarts": float(counts.restarts),
            "fleet/requests_moved": float(counts.moved_samples),
            "fleet/time_lost_s": counts.time_lost_s,
        }

    def call_async(self, method: str, *args, **kwargs) -> List[Any]:
        """``method`` on every rank of every engine in service."""
        return [ref for engine in self.serving() for ref in engine.group.call_async(method, *args, **kwargs)]

    def fail(self, engine: Engine, phase: str, why: str, key: str, lost_s: float = 0.0) -> None:
        """An engine failed in ``phase``: without fault tolerance the run stops (EngineFailed naming it); with it
        the engine is killed and leaves service (restarted at the next weight sync while restarts remain)."""
        import ray

        line = f"rollout engine {engine.index} failed during {phase}: {why} ({key})"
        if not self.limits.enabled:
            raise EngineFailed(line)
        with self.lock:
            if engine.down:
                return
            engine.down, engine.serving = True, False
            self.counts.failures += 1
            self.counts.time_lost_s += lost_s
            left = sum(e.serving for e in self.engines)
        for handle in engine.group.handles:
            ray.kill(handle, no_restart=True)
        restart = (
            f"restart {engine.restarts + 1} of {self.limits.max_restarts_per_engine} at the next weight sync"
            if engine.restarts < self.limits.max_restarts_per_engine and self.respawn is not None
            else "no restart left: it stays out of service"
        )
        print(f"{line}; taken out of service ({left} engine(s) serving); {restart}", flush=True)
        self.check_minimum(f"engine {engine.index}: {why}")

    def check_minimum(self, cause: str) -> None:
        left = len(self.serving())
        if left >= self.limits.min_healthy_engines:
            self.stop_reason = None
        elif self.stop_reason is None:
            self.stop_reason = (
                f"{left} rollout engine(s) in service, below {KEY}.min_healthy_engines = "
                f"{self.limits.min_healthy_engines} ({cause})"
            )

    # ----- generation -------------------------------------------------------------------------------
    def submit_generate(self, request: RolloutRequest, version: Optional[int] = None) -> FleetPending:
        """Start ``request`` on the engines in service, a contiguous range of prompts each (sample j of the whole
        request seeded ``seed + j`` whichever engine draws it)."""
        live = self.serving()
        if not live:
            raise EngineFailed(f"no rollout engine in service to generate on ({self.stop_reason or 'all failed'})")
        pending = FleetPending(request, version, [])
        for engine, rows in zip(live, engine_prompt_split(len(request.prompts), len(live))):
            if len(rows):
                pending.parts.append(self._submit(engine, int(rows[0]), request.part(rows), version))
        return pending

    def _submit(self, engine: Engine, first: int, part: RolloutRequest, version: Optional[int]) -> Part:
        return Part(first, part, engine, engine.group.submit_generate(part, version), time.monotonic())

    def collect_generate(self, pending: FleetPending) -> GeneratedBatch:
        """Every part's outputs with global prompt indices; an engine that dies, passes the generate deadline or its
        health probe, or answers garbage fails (``fail``) and its part goes to an engine in service once that
        engine's own part is done (an engine generates one request at a time)."""
        import ray

        outputs: List[RolloutOutput] = []
        results, timings = [], []
        parts, probes = list(pending.parts), Probes(self.limits)
        while parts or pending.moved:
            self._place_moved(pending, parts)
            refs = [ref for part in parts for ref in part.pending.refs]
            done = set(ray.wait(refs, num_returns=len(refs), timeout=self._tick())[0]) if refs else set()
            for part in list(parts):
                answer = self._answer(part, probes, all(ref in done for ref in part.pending.refs))
                if answer is None:
                    continue
                parts.remove(part)
                probes.forget(part.engine)
                if isinstance(answer, str):  # the engine failed: its part waits for another
                    pending.moved.append((part.first, part.request))
                    self.counts.moved_samples += len(part.request.prompts) * part.request.n
                    continue
                for out in answer.outputs:
                    out.prompt_index += part.first
                outputs += answer.outputs
                results += answer.per_rank
                timings.append(answer.timing)
        # the order of one whole request: by prompt, each prompt's samples as their engine returned them (stable)
        outputs.sort(key=lambda out: out.prompt_index)
        results.sort(key=lambda result: (result.engine, result.rank))
        return GeneratedBatch(outputs, slowest(timings), results)

    def _tick(self) -> float:
        return min(self.limits.health_check_interval_s, 1.0) if self.limits.enabled else 1.0

    def _answer(self, part: Part, probes: "Probes", done: bool):
        """The part's GeneratedBatch once it is ``done`` and sound; a string once its engine failed; else None."""
        import ray

        engine, waited = part.engine, time.monotonic() - part.submitted
        if done:
            try:
                batch = engine.group.collect_generate(part.pending)
            except ray.exceptions.RayActorError as exc:
                if not self.limits.enabled:
                    raise
                return self._failed(engine, "generate", f"its process died ({first_line(exc)})", KEY, waited)
            problem = answer_problem(batch.outputs, part.request, self.vocab_size, self.max_tokens)
            if problem is None:
                return batch
            return self._failed(engine, "generate", f"it answered garbage: {problem}", KEY, waited)
        if waited > self.limits.generate_timeout_s:
            why = f"no answer within {self.limits.generate_timeout_s:g} s"
            return self._failed(engine, "generate", why, f"{KEY}.generate_timeout_s", waited)
        if self.limits.enabled:
            late = probes.check(engine)
            if late is not None:
                why = f"its health probe had no answer within {late:g} s"
                return self._failed(engine, "generate", why, f"{KEY}.health_check_timeout_s", waited)
        return None

    def _failed(self, engine: Engine, phase: str, why: str, key: str, lost_s: float) -> str:
        self.fail(engine, phase, why, key, lost_s)
        return why

    def _place_moved(self, pending: FleetPending, parts: List[Part]) -> None:
        """Moved parts to engines in service that have nothing of this request running."""
        if not pending.moved:
            return
        busy = {id(part.engine) for part in parts}
        idle = [engine for engine in self.serving() if id(engine) not in busy]
        if not idle and not parts:
            raise EngineFailed(
                f"no rollout engine in service to take the requests of a failed one ({self.stop_reason or KEY})"
            )
        for engine in idle:
            if not pending.moved:
                break
            first, request = pending.moved.pop(0)
            parts.append(self._submit(engine, first, request, pending.version))

    # ----- weights ----------------------------------------------------------------------------------
    def sync_weights(self, actor, version: int, pause_timeout_s: Optional[float] = None, recompute=False) -> None:
        """The actor's weights of ``version`` into every engine in service, engines out of service restarted first
        (while restarts remain) so that they hold them too. ``pause_timeout_s`` (in-flight updates): the engines
        pause first and resume after, all together (``workers/fleet_weights.py``)."""
        from .fleet_weights import sync_weights

        sync_weights(self, actor, version, pause_timeout_s, recompute)
