"""What runs inside a rule-reward worker process (kept free of torch: workers start fast and small)."""

from __future__ import annotations

import importlib
from typing import Any, List, Optional, Sequence, Tuple

from .registry import get_verifier

# an answer only a symbolic comparison can settle: exercises every lazy import of the math verifiers
WARM_UP_RESPONSE, WARM_UP_LABEL = "The answer is \\boxed{\\frac{1}{2}}", "0.5"
_START_ERROR: Optional[str] = None
_VALUES: Any = None  # (the write end of the pool's value pipe, the lock its writers share)


def start_worker(modules: Sequence[str], values: Any = None) -> None:
    """Pool initializer: no logging; the verifiers' modules imported (registering them); ``values``: where
    :func:`run_chunk` sends each sample's value. A failing import is kept and reported by :func:`warm_up` (an
    initializer that raises would only be restarted, silently)."""
    global _START_ERROR, _VALUES
    import logging

    _VALUES = values

    logging.disable(logging.CRITICAL)
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - reported to the driver by warm_up
            _START_ERROR = f"importing {module}: {type(exc).__name__}: {exc}"


def warm_up(names: Sequence[str]) -> List[str]:
    """Each verifier once, so its lazy imports (math-verify -> sympy: seconds on a busy host) are not charged
    to the first sample's timeout. Returns what is wrong in this worker (empty when ready)."""
    if _START_ERROR:
        return [_START_ERROR]
    problems = []
    for name in names:
        try:
            verifier = get_verifier(name)
        except KeyError:
            problems.append(
                f"verifier {name!r} is not registered in the worker: register it at import time of "
                "its module (not inside a function or a __main__ block)"
            )
            continue
        try:
            verifier(WARM_UP_RESPONSE, WARM_UP_LABEL)
        except Exception:  # noqa: BLE001 - a verifier that fails here fails (and is counted) per sample later
            pass
    return problems


def run_one(name: str, response: str, label: str) -> float:
    try:
        return float(get_verifier(name)(response, label))
    except Exception:  # noqa: BLE001 - a failing verifier scores 0, counted by the caller
        return float("nan")


def run_chunk(chunk: int, tasks: Sequence[Tuple[int, str, str, str]]) -> int:
    """Score ``(index, verifier, response, label)`` tasks in order: ``(chunk, None, None)`` when it starts, then
    ``(chunk, index, value)`` as each one ends. One call for many samples, while the driver still sees which
    sample runs (and may hang)."""
    connection, lock = _VALUES
    with lock:
        connection.send((chunk, None, None))
    for index, name, response, label in tasks:
        value = run_one(name, response, label)
        with lock:
            connection.send((chunk, index, value))
    return len(tasks)
