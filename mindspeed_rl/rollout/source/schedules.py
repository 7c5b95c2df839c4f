"""Schedules: when trajectories are generated relative to training (the outer rollout layer).

    Synchronous   a batch is generated with the current weights and finished before training: every
                  trajectory drawn for it runs to its end; groups a filter does not need are discarded
    Chunked       partial rollout: rounds of at most ``ceil(max_tokens / max_split)`` tokens per trajectory,
                  a batch's worth of groups kept growing; a batch takes finished groups oldest first, the
                  rest stays parked with its tokens, per-token log-probs and versions, and continues with
                  the next iteration's weights. With ``require_max_age_all_finished`` no group is offered
                  while a trajectory parked ``max_split - 1`` iterations is unfinished: it finishes within
                  max_split iterations and its group trains first
    InStep        around either of them: each batch produced when the trainer takes it (max_head_offpolicyness 0)
    Ahead         asynchronous rollout around either of them: the batches of iterations k .. k + L are
                  produced in a thread of the driver while the trainer trains; batch j uses the weights of
                  version j - L (once j >= L) and the weight update waits until the productions in flight
                  are done, so no batch ever mixes weights it was not submitted with
    InFlight      fully asynchronous: as Ahead, but a weight update waits for nothing: it reaches the engines
                  while their requests are in flight (the service pauses, loads, resumes them), so the engines
                  never stop for training; a trajectory's tokens may come from several versions, each recorded

Each is one class typed by a Protocol (``RoundSchedule``: Synchronous, Chunked; ``BatchSchedule``: InStep, Ahead)
that carries its own refusals, metrics and the factory that reads its keys (``round_schedule``, ``batch_schedule``);
the keys' rules across sections and the plan's lines are their features' (features/partial_rollout.py,
features/async_rollout.py).

A production is deterministic (the rounds' composition depends on the trajectories only, their seeds on the
run's seed stream), so what a checkpoint holds (the parked pool, the batches produced ahead) resumes into
exactly the batches an uninterrupted run trains on.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

from ...config_cls.base import ConfigError
from ...features.partial_rollout import partial_chunk
from ...utils.clock import Clock
from .production import Produced
from .rounds import TrajectoryPool
from .trajectory import Trajectory


@runtime_checkable
class RoundSchedule(Protocol):
    """When trajectories generate within a batch's production, and what the pool keeps after it."""

    name: str
    parks: bool  # unfinished trajectories outlive their batch (off-policy tokens)
    chunk: int  # tokens a trajectory grows per round

    def keeps_generating(self, pool: TrajectoryPool) -> bool: ...
    def holds_back(self, pool: TrajectoryPool) -> bool: ...
    def wants_prompts(self, pool: TrajectoryPool, group_filter) -> bool: ...
    def offerable(self, pool: TrajectoryPool) -> List[int]: ...
    def leave(self, pool: TrajectoryPool) -> None: ...
    def metrics(
        self, pool: TrajectoryPool, batch: Sequence[Sequence[Trajectory]], rounds: int, tokens: int, drawn: int
    ) -> Dict[str, float]: ...


@runtime_checkable
class BatchSchedule(Protocol):
    """When a batch is produced relative to training: in step, or up to ``lag`` versions ahead."""

    name: str
    lag: int

    def fill(self, iteration: int, produce: Callable[[int], Produced]) -> None: ...
    def take(self, iteration: int) -> Tuple[Produced, Dict[str, float]]: ...
    def settle(self, clock: Optional[Clock] = None) -> float: ...
    def produced(self) -> List[Produced]: ...
    def restore(self, produced: List[Produced]) -> None: ...
    def close(self) -> None: ...


class Synchronous:
    name = "sync"
    parks = False

    def __init__(self, max_tokens: int) -> None:
        self.chunk = max_tokens

    def keeps_generating(self, pool: TrajectoryPool) -> bool:
        """After the filter is satisfied: every trajectory drawn for the batch runs to its end."""
        return pool.unfinished()

    def holds_back(self, pool: TrajectoryPool) -> bool:
        """Whether finished groups wait before they are offered to the filter."""
        return False

    def wants_prompts(self, pool: TrajectoryPool, group_filter) -> bool:
        """Draw only what the batch can still use: a group drawn beyond it would be discarded."""
        return len(pool.groups()) + len(group_filter.kept) < group_filter.want

    def offerable(self, pool: TrajectoryPool) -> List[int]:
        """Finished groups in draw order up to the first unfinished one: a group that takes longer (more turns,
        a longer answer) is never passed over by a later draw's quicker ones."""
        ready = []
        for group, members in pool.groups().items():
            if not all(t.done for t in members):
                break
            ready.append(group)
        return ready

    def leave(self, pool: TrajectoryPool) -> None:
        """After the batch is taken: a synchronous batch leaves nothing behind."""
        pool.trajectories = []

    def metrics(self, pool, batch, rounds, tokens, drawn) -> Dict[str, float]:
        return {}


class Chunked:
    name = "partial"
    parks = True

    def __init__(self, max_tokens: int, max_split: int, require_max_age_all_finished: bool = True) -> None:
        if max_split < 1:
            raise ValueError(f"partial_rollout_max_split must be >= 1, got {max_split}")
        self.max_split, self.require_oldest = max_split, require_max_age_all_finished
        self.chunk = partial_chunk(max_tokens, max_split)

    def keeps_generating(self, pool: TrajectoryPool) -> bool:
        """After the filter is satisfied: only while a trajectory at the maximum age is unfinished."""
        return self.holds_back(pool)

    def holds_back(self, pool: TrajectoryPool) -> bool:
        """With require_max_age_all_finished, no group is offered while a trajectory at the maximum age is
        unfinished: once it finishes, its (oldest) group is offered first and trains in this batch."""
        return self.require_oldest and pool.oldest_unfinished(self.max_split - 1)

    def wants_prompts(self, pool: TrajectoryPool, group_filter) -> bool:
        """Keep a batch's worth of groups growing: the long tail grows beside fresh prompts instead of holding
        the engines alone (what finishes beyond the batch stays parked for the next one)."""
        return pool.growing_groups() < group_filter.want

    def offerable(self, pool: TrajectoryPool) -> List[int]:
        """Every finished group, oldest first: the long tail must not hold the batch."""
        return pool.finished_groups()

    def leave(self, pool: TrajectoryPool) -> None:
        """After the batch is taken: what stays parked is one iteration older."""
        for traj in pool.trajectories:
            traj.age += 1

    def metrics(self, pool, batch, rounds, tokens, drawn) -> Dict[str, float]:
        """The batch and the pool it leaves (partial_rollout/*)."""
        trajectories = [t for g in batch for t in g]
        carried = [t for t in trajectories if t.age > 0]
        return {
            "partial_rollout/rounds": float(rounds),
            "partial_rollout/generated_tokens": float(tokens),
            "partial_rollout/drawn_prompts": float(drawn),
            "partial_rollout/parked": float(sum(not t.done for t in pool.trajectories)),
            "partial_rollout/finished_waiting": float(sum(t.done for t in pool.trajectories)),
            "partial_rollout/carried_share": len(carried) / max(1, len(trajectories)),
            "partial_rollout/max_age": float(max((t.age for t in trajectories), default=0)),
        }


@dataclass
class _Slot:
    iteration: int
    done: threading.Event = field(default_factory=threading.Event)
    produced: Optional[Produced] = None
    error: Optional[BaseException] = None
    waited: float = 0.0  # seconds the trainer waited for this production, over every wait


class InStep:
    """Lag 0: the batch of an iteration is produced when the trainer takes it, on the trainer's thread."""

    name = "in_step"
    lag = 0

    def fill(self, iteration: int, produce: Callable[[int], Produced]) -> None:
        self._produce = produce

    def take(self, iteration: int) -> Tuple[Produced, Dict[str, float]]:
        return self._produce(iteration), {}

    def settle(self, clock: Optional[Clock] = None) -> float:
        return 0.0

    def produced(self) -> List[Produced]:
        return []

    def close(self) -> None:
        pass

    def restore(self, produced: List[Produced]) -> None:
        if produced:
            raise ConfigError(
                "rl_config.max_head_offpolicyness",
                f"0, but the checkpoint holds {len(produced)} batch(es) produced ahead: resume with the run's "
                "max_head_offpolicyness (and its rollout_resource)",
            )


class Ahead:
    """Productions of the batches ahead, one after the other in one daemon thread of the driver."""

    name = "async"

    def __init__(self, lag: int) -> None:
        if lag < 1:
            raise ValueError("asynchronous rollout needs max_head_offpolicyness >= 1")
        self.lag = lag
        self.slots: Deque[_Slot] = deque()
        self._tasks: "queue.Queue[Tuple[_Slot, Callable[[int], Produced]]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._failed: Optional[BaseException] = None

    def _run(self) -> None:
        while True:
            slot, produce = self._tasks.get()
            try:
                if self._failed is not None:
                    raise self._failed
                slot.produced = produce(slot.iteration)
            except BaseException as exc:  # handed to the trainer's thread, which raises it
                self._failed = slot.error = exc
            finally:
                slot.done.set()

    def fill(self, iteration: int, produce: Callable[[int], Produced]) -> None:
        """Queue the productions of the iterations up to ``iteration + lag`` not queued yet. The last
        iterations of a run also produce batches beyond its end: the final checkpoint keeps them, so a run
        resumed with more iterations trains on exactly what an uninterrupted run would have."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rollout-ahead", daemon=True)
            self._thread.start()
        upcoming = self.slots[-1].iteration + 1 if self.slots else iteration
        while upcoming <= iteration + self.lag:
            slot = _Slot(upcoming)
            self.slots.append(slot)
            self._tasks.put((slot, produce))
            upcoming += 1

    def take(self, iteration: int) -> Tuple[Produced, Dict[str, float]]:
        """Iteration ``iteration``'s batch, waiting for it (its clock takes the wait as timing/rollout_wait), and
        async/overlap_share: the share of its production that ran while the trainer did something else (the
        trainer waits for it before an earlier weight update and when it takes it)."""
        if not self.slots or self.slots[0].iteration != iteration:
            queued = [s.iteration for s in self.slots]
            raise RuntimeError(f"asynchronous rollout: no batch for iteration {iteration} (queued: {queued})")
        slot = self.slots.popleft()
        waited = self._wait(slot)  # the production is in once it returns
        produced = slot.produced
        assert produced is not None  # set before done, or _wait raised the production's error
        produced.clock.add("timing/rollout_wait", waited)
        seconds = produced.seconds
        return produced, {"async/overlap_share": max(0.0, 1.0 - slot.waited / seconds) if seconds > 0 else 0.0}

    def settle(self, clock: Optional[Clock] = None) -> float:
        """Wait until every queued production is done (before the weights change or a checkpoint); the wait is
        the trainer's idle time (``clock``: timing/rollout_wait and timing/trainer_idle)."""
        settled = self.drain()
        if clock is not None:
            clock.add("timing/rollout_wait", settled)
            clock.add("timing/trainer_idle", settled)
        return settled

    def drain(self) -> float:
        """Wait until every queued production is done; the seconds waited."""
        return sum(self._wait(slot) for slot in self.slots)

    def _wait(self, slot: _Slot) -> float:
        start = time.perf_counter()
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        waited = time.perf_counter() - start
        slot.waited += waited
        return waited

    def produced(self) -> List[Produced]:
        """The batches produced ahead, once every queued production is done (what a checkpoint holds)."""
        self.drain()
        return [slot.produced for slot in self.slots if slot.produced is not None]

    def close(self, timeout: float = 120.0) -> None:
        """No queued production starts; the one running ends (before the process does: a production thread cut
        short at exit aborts it); a production that does not end within ``timeout`` s is left to the exit."""
        if self._failed is None:
            self._failed = RuntimeError("asynchronous rollout: the rollout source is closed")
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            slot.done.wait(max(0.0, deadline - time.monotonic()))

    def restore(self, produced: List[Produced]) -> None:
        """Batches a checkpoint holds, as produced (``.iteration`` each, in order)."""
        self.slots.clear()
        for item in produced:
            slot = _Slot(item.iteration, produced=item)
            slot.done.set()
            self.slots.append(slot)


class InFlight(Ahead):
    """Fully asynchronous: the productions ahead as in Ahead, and a weight update that waits for none of them (the
    service updates the engines in flight). What a batch holds then depends on when each update landed: a resumed
    run loses and repeats no trajectory (a checkpoint waits for the productions in flight and stores them), but
    it need not make the same batches as the run that was not stopped."""

    name = "fully_async"

    def settle(self, clock: Optional[Clock] = None) -> float:
        """Nothing to wait for before a weight update: the engines take it in flight."""
        return 0.0


def round_schedule(rl, max_tokens: int) -> RoundSchedule:
    """The schedule of rounds for rl_config: partial chunks with partial_rollout_max_split > 1, else synchronous."""
    if rl.partial_rollout_max_split > 1:
        return Chunked(max_tokens, rl.partial_rollout_max_split, rl.require_max_age_all_finished)
    return Synchronous(max_tokens)


def batch_schedule(lag: int, in_flight: bool = False) -> BatchSchedule:
    """The schedule of batches relative to training for rl_config.max_head_offpolicyness ``lag`` (``in_flight``:
    rl_config.async_training.in_flight_weight_updates)."""
    if lag == 0:
        return InStep()
    return InFlight(lag) if in_flight else Ahead(lag)
