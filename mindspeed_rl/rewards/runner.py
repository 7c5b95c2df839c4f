"""Rule rewards off the driver: verifiers run in a small process pool with a per-sample timeout.

score_i = sum_k w_k * verifier_k(response_i, label_i); a verifier that raises scores 0 and one
that runs past ``timeout`` seconds scores 0; both are counted (a hung worker is replaced).
"""
from __future__ import annotations

import multiprocessing as mp
from typing import Dict, List, Sequence, Tuple

import torch

from .registry import get_verifier


# an answer only a symbolic comparison can settle: exercises every lazy import of the math verifiers
WARM_UP_RESPONSE, WARM_UP_LABEL = "The answer is \\boxed{\\frac{1}{2}}", "0.5"


def _quiet_worker() -> None:
    """In a freshly forked verifier worker: no logging and new stdio objects. The driver's threads (Ray's log
    forwarding, our log handlers) may have held a stream's lock at the fork; a worker writing through the
    inherited objects would wait on it forever."""
    import logging
    import sys

    logging.disable(logging.CRITICAL)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)


def _run_one(name: str, response: str, label: str) -> float:
    try:
        return float(get_verifier(name)(response, label))
    except Exception:  # noqa: BLE001 - a failing verifier scores 0, counted by the caller
        return float("nan")


class RuleRewardRunner:
    def __init__(self, names: Sequence[str], weights: Sequence[float], timeout: float = 10.0, workers: int = 1):
        for name in names:
            verifier = get_verifier(name)  # unknown names fail here, not in a worker
            # Run each verifier once here so that what it imports lazily (math-verify pulls in sympy, seconds
            # on a busy host) is loaded before the pool forks: the per-sample timeout then measures
            # verification only, and a pool replaced after a timeout starts warm.
            try:
                verifier(WARM_UP_RESPONSE, WARM_UP_LABEL)
            except Exception:  # noqa: BLE001 - a verifier that fails here fails (and is counted) per sample later
                pass
        self.names, self.weights = list(names), list(weights)
        self.timeout, self.workers = timeout, workers
        self._pool = None

    def _get_pool(self):
        if self._pool is None:
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            self._pool = mp.get_context(method).Pool(self.workers, initializer=_quiet_worker)
        return self._pool

    def _restart(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def score(self, responses: Sequence[str], labels: Sequence[str]) -> Tuple[torch.Tensor, Dict[str, float]]:
        """The weighted score of every response, and the metrics."""
        per_verifier, metrics = self.score_each(responses, labels)
        return self.weighted(per_verifier), metrics

    def weighted(self, per_verifier: Dict[str, torch.Tensor]) -> torch.Tensor:
        """score_i = sum_k w_k * verifier_k(i), from ``score_each``'s values."""
        return sum(weight * per_verifier[name] for name, weight in zip(self.names, self.weights))

    def score_each(self, responses: Sequence[str], labels: Sequence[str]) -> Tuple[Dict[str, torch.Tensor],
                                                                                     Dict[str, float]]:
        """Each verifier's value for every response (unweighted), and the metrics."""
        tasks = [(k, name, r, l) for k, name in enumerate(self.names) for r, l in zip(responses, labels)]
        results: List[float] = [0.0] * len(tasks)
        timeouts = failures = 0
        start = 0
        while start < len(tasks):
            pool = self._get_pool()
            pending = [pool.apply_async(_run_one, task[1:]) for task in tasks[start:]]
            restarted = False
            for offset, job in enumerate(pending):
                index = start + offset
                try:
                    value = job.get(timeout=self.timeout)
                except mp.TimeoutError:  # hung: score 0, replace the pool, resubmit what follows
                    timeouts += 1
                    self._restart()
                    start, restarted = index + 1, True
                    break
                if value != value:  # nan: the verifier raised
                    value, failures = 0.0, failures + 1
                results[index] = value
            if not restarted:
                break
        per_verifier: Dict[str, torch.Tensor] = {}
        metrics: Dict[str, float] = {}
        n = len(responses)
        for k, name in enumerate(self.names):
            per_verifier[name] = torch.tensor(results[k * n:(k + 1) * n], dtype=torch.float32)
            metrics[f"{name}_rewards/mean"] = float(per_verifier[name].mean()) if n else 0.0
        metrics["rule_reward/timeouts"] = float(timeouts)
        metrics["rule_reward/failures"] = float(failures)
        return per_verifier, metrics

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None
