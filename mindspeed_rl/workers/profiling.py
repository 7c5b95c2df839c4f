"""One worker's profiling of its role's stages (profiler_config): a profiled call of a chosen stage, in a chosen
iteration, on a chosen rank, is traced by the accelerator's profiler into

    <save>/<role>/rank<r>/<stage>_iter<k>_<n>.json      the trace (Chrome format; NPU: the profiler's folder)
    <save>/<role>/rank<r>/summary.jsonl                 one line per traced call: its top operators

and with ``mstx`` every stage call is a named range (seen by any profiler that records, ours or the vendor's)."""

from __future__ import annotations

import functools
import json
import os
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

TOP_OPERATORS = 10


def top_operators(prof: Any, sort_key: str, count: int = TOP_OPERATORS) -> List[Dict[str, Any]]:
    """The ``count`` operators of ``prof`` (a finished torch profiler) with the most self time (``sort_key``):
    name, calls, self and total milliseconds."""
    averages = prof.key_averages()
    rows = sorted(averages, key=lambda e: getattr(e, sort_key, 0.0), reverse=True)[:count]
    return [
        {
            "name": e.key,
            "calls": int(e.count),
            "self_ms": round(getattr(e, sort_key, 0.0) / 1000.0, 3),
            "total_ms": round(e.cpu_time_total / 1000.0, 3),
        }
        for e in rows
    ]


def profiled(stage: Union[str, Callable[..., str]]) -> Callable:
    """A worker method run inside its stage's profiling (``stage``: the name, or a function of the call's
    arguments giving it)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def inner(self, *args, **kwargs):
            with self.profiling.stage(stage(*args, **kwargs) if callable(stage) else stage):
                return method(self, *args, **kwargs)

        return inner

    return wrap


class StageProfiler:
    """Profiles the stages ``settings`` (a RoleProfilerConfig, or None: nothing) chooses for ``role`` on ``rank``;
    the trainer sets the iteration and the save folder (``at``) at the start of each iteration."""

    def __init__(self, acc: Any, role: str, rank: int, settings: Optional[Any]):
        self.acc, self.role, self.rank, self.settings = acc, role, rank, settings
        self.ranges = settings is not None and settings.mstx
        self.chosen = (
            set(settings.stages(role))
            if settings is not None and settings.traces() and settings.profiles_rank(rank)
            else set()
        )
        self.iteration = 0
        self.save_dir = ""
        self.calls: Counter = Counter()

    def at(self, iteration: int, save_dir: str) -> None:
        self.iteration = iteration
        self.save_dir = (self.settings.profile_save_path if self.settings else "") or save_dir

    def traced(self, stage: str) -> bool:
        return stage in self.chosen and bool(self.save_dir) and self.settings.profiles_iteration(self.iteration)

    def folder(self) -> str:
        return os.path.join(self.save_dir, self.role, f"rank{self.rank}")

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        with self.acc.trace_range(name) if self.ranges else nullcontext():
            if not self.traced(name):
                yield
                return
            folder = self.folder()
            os.makedirs(folder, exist_ok=True)
            started = time.perf_counter()
            prof = self.acc.profiler(self.settings, folder)
            with prof:
                yield
            self.write(name, prof, time.perf_counter() - started)

    def write(self, stage: str, prof: Any, seconds: float) -> None:
        key = (stage, self.iteration)
        self.calls[key] += 1
        folder = self.folder()
        trace = self.acc.export_trace(
            prof, os.path.join(folder, f"{stage}_iter{self.iteration}_{self.calls[key]}.json")
        )
        row = {
            "role": self.role,
            "rank": self.rank,
            "stage": stage,
            "iteration": self.iteration,
            "call": self.calls[key],
            "seconds": round(seconds, 4),
            "trace": os.path.basename(trace) if trace else None,
            "top": top_operators(prof, self.acc.profile_sort_key),
        }
        with open(os.path.join(folder, "summary.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
