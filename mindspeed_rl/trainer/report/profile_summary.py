"""The run report's profiler section: each profiled stage's top operators, read from the traced calls' summaries
(``<run_dir>/profiler/<role>/rank<r>/summary.jsonl``, written by workers/profiling.py)."""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from typing import Any, Dict, List, Tuple

Operators = List[Dict[str, Any]]


def stage_tables(run_dir: str, count: int = 10) -> List[Tuple[str, Operators]]:
    """(title, top operators) per profiled role and stage: each operator's calls and self milliseconds summed over
    the stage's traced calls on every rank, the ``count`` largest first."""
    calls: Dict[Tuple[str, str], int] = defaultdict(int)
    seconds: Dict[Tuple[str, str], float] = defaultdict(float)
    operators: Dict[Tuple[str, str], Dict[str, Dict[str, float]]] = defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(run_dir, "profiler", "*", "rank*", "summary.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                key = (row["role"], row["stage"])
                calls[key] += 1
                seconds[key] += row["seconds"]
                for op in row["top"]:
                    total = operators[key].setdefault(op["name"], {"calls": 0, "self_ms": 0.0})
                    total["calls"] += op["calls"]
                    total["self_ms"] += op["self_ms"]
    tables = []
    for key in sorted(calls):
        top = sorted(operators[key].items(), key=lambda kv: kv[1]["self_ms"], reverse=True)[:count]
        title = f"{key[0]} {key[1]}: {calls[key]} traced call(s), {seconds[key]:.2f} s"
        tables.append((title, [{"name": name, **totals} for name, totals in top]))
    return tables
