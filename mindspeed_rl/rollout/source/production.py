"""The records of a rollout production: the seed stream its rounds draw from, one batch as produced (groups of
scored trajectories, metrics, clock; what a checkpoint keeps of a batch produced ahead), what the trainer gets,
and how the metrics of several scoring calls add up."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ...protocol import Experience
from ...utils.clock import Clock
from .trajectory import Trajectory


class SeedStream:
    """Sample seeds handed out in order: a round's request j is seeded ``base + j`` and the next round starts
    where it ended, so no two samples of a run share a seed (in the 32 bits torch's CPU generator keeps) until
    2**32 samples. Where a stream starts is a hash of the user's seed and the stream's name: runs with seeds one
    apart draw unrelated streams. ``used`` is part of the source's state, so a resume continues the stream."""

    def __init__(self, seed: int, name: str, used: int = 0) -> None:
        digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=4).digest()
        self.start, self.used = int.from_bytes(digest, "little"), used

    def take(self, count: int) -> int:
        base = (self.start + self.used) % 2**32
        self.used += count
        return base


class EngineMeter:
    """Seconds with a generation request in flight, added by each round as it returns (from the production thread);
    ``idle_share`` is the share of the wall time since its previous call without one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0.0
        self._last: Optional[Tuple[float, float]] = None  # (time, busy) at the previous read

    def add(self, seconds: float) -> None:
        with self._lock:
            self._busy += seconds

    def idle_share(self) -> Optional[float]:
        """1 - busy / wall over the interval since the previous call; None at the first call (it starts the clock)."""
        now = time.perf_counter()
        with self._lock:
            busy, last, self._last = self._busy, self._last, (now, self._busy)
        if last is None or now <= last[0]:
            return None
        return min(1.0, max(0.0, 1.0 - (busy - last[1]) / (now - last[0])))


@dataclass
class Produced:
    """One batch as produced: its prompt groups (n trajectories each, scored), metrics, the production's
    clock and wall time, the policy version it started with."""

    iteration: int
    version: int
    groups: List[List[Trajectory]]
    metrics: Dict[str, float] = field(default_factory=dict)
    clock: Clock = field(default_factory=Clock)
    seconds: float = 0.0

    def state(self) -> Dict:
        return {
            "iteration": self.iteration,
            "version": self.version,
            "groups": [[t.state() for t in g] for g in self.groups],
            "metrics": dict(self.metrics),
            "timing": dict(self.clock.timing),
            "seconds": self.seconds,
        }

    @staticmethod
    def from_state(state: Dict) -> "Produced":
        clock = Clock()
        clock.timing.update(state.get("timing", {}))
        groups = [[Trajectory.from_state(t) for t in g] for g in state["groups"]]
        metrics, seconds = dict(state.get("metrics", {})), float(state.get("seconds", 0.0))
        return Produced(int(state["iteration"]), int(state["version"]), groups, metrics, clock, seconds)


@dataclass
class RolloutBatch:
    """What the trainer gets: the scored experience, the rollout's metrics and its clock."""

    experience: Experience
    metrics: Dict[str, float]
    clock: Clock


COUNTS = (  # summed, not averaged
    "rule_reward/timeouts",
    "rule_reward/failures",
    "rollout/out_of_vocab_tokens",
    "judge/request_failures",
    "judge/parse_failures",
)


def average(weighted: Sequence[Tuple[int, Dict[str, float]]]) -> Dict[str, float]:
    """Metrics of several scoring calls: counts (``COUNTS``) summed, the others weighted by the calls' rows."""
    total: Dict[str, float] = {}
    rows: Dict[str, int] = {}
    for count, metrics in weighted:
        for key, value in metrics.items():
            total[key] = total.get(key, 0.0) + (value if key in COUNTS else value * count)
            rows[key] = rows.get(key, 0) + count
    return {key: total[key] if key in COUNTS else total[key] / rows[key] for key in total}
