"""Named phase times of one piece of work, and when each ran (for the run report's timeline)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Dict, List, Tuple


class Clock:
    """Seconds per phase (``timing/...``, summed over repeats) and the wall-clock span of every measurement.
    One clock per piece of work: the trainer's iteration, one batch's production (which may run in a thread
    of its own, so it never shares a clock with the iteration it overlaps)."""

    def __init__(self) -> None:
        self.timing: Dict[str, float] = {}
        self.spans: List[Tuple[str, float, float]] = []  # (phase, start, end), time.time() seconds

    @contextmanager
    def measure(self, name: str):
        wall, start = time.time(), time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.add(name, elapsed)
            self.spans.append((name, wall, wall + elapsed))

    def record(self, name: str, start: float, end: float) -> None:
        """A measurement taken elsewhere: its span, ``start`` and ``end`` in time.time() seconds."""
        self.add(name, end - start)
        self.spans.append((name, start, end))

    def add(self, name: str, seconds: float) -> None:
        self.timing[name] = self.timing.get(name, 0.0) + seconds

    def merge(self, other: "Clock") -> None:
        for name, seconds in other.timing.items():
            self.add(name, seconds)
        self.spans += other.spans
