"""Rule rewards off the driver: verifiers run in a small process pool with a per-sample timeout.

score_i = sum_k w_k * verifier_k(response_i, label_i); a verifier that raises or returns NaN/Inf scores 0
(said once per verifier for Inf) and one that runs past ``timeout`` seconds scores 0; both are counted
(a hung worker is replaced).

Each worker gets its samples in one call and sends each value as it ends (``pool_worker.run_chunk``): one
message per sample instead of one call (a round trip through the pool's handler threads: 128 quick samples
13-26 ms, now 2-8 ms), while the driver still knows which sample runs past the timeout.

Workers come from a fork server, not from forking the driver: the driver runs threads (Ray's,
logging's) whose locks a forked child can inherit held, and such a child hangs on its first write
or import; in the suite that showed as 2-13 verifier timeouts of 10 s per iteration, mostly in the
second run of a process. A verifier's module is imported in each worker (it registers there as in
the driver), and every new worker runs each verifier once before its samples are timed.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .pool_worker import run_chunk, start_worker, warm_up
from .registry import get_verifier


class RuleRewardRunner:
    WARM_UP_TIMEOUT = 120.0

    def __init__(self, names: Sequence[str], weights: Sequence[float], timeout: float = 10.0, workers: int = 1):
        # unknown names fail here, not in a worker; each verifier's module registers it again in a worker
        self.modules = sorted({get_verifier(name).__module__ for name in names})
        self.names, self.weights = list(names), list(weights)
        self.timeout, self.workers = timeout, workers
        self._pool = None
        self._pipe: Tuple = ()  # (read end, write end) of the pipe the pool's workers send values into
        self._warned = set()  # verifiers already named for a non-finite score

    def _get_pool(self):
        if self._pool is None:
            method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
            context = mp.get_context(method)
            if method == "forkserver":
                # imported once in the server, so every worker forks warm (a missing module is skipped)
                context.set_forkserver_preload(
                    ["mindspeed_rl.rewards.pool_worker", "mindspeed_rl.rewards.verifiers", "sympy", "math_verify"]
                )
            # a pipe per pool: a worker stopped while it writes leaves a message cut short in its pool's pipe only.
            # The driver keeps the write end open: the pool hands it to a worker that replaces a dead one
            self._pipe = context.Pipe(duplex=False)
            self._pool = context.Pool(
                self.workers, initializer=start_worker, initargs=(self.modules, (self._pipe[1], context.Lock()))
            )
            try:
                reports = self._pool.map_async(warm_up, [self.names] * self.workers, chunksize=1).get(
                    self.WARM_UP_TIMEOUT
                )
            except mp.TimeoutError:
                self._restart()
                raise RuntimeError(
                    f"rule reward workers did not start within {self.WARM_UP_TIMEOUT:.0f}s "
                    f"(verifiers {', '.join(self.names)})"
                ) from None
            problems = sorted({p for report in reports for p in report})
            if problems:
                self._restart()
                raise RuntimeError("rule reward workers cannot run the verifiers: " + "; ".join(problems))
        return self._pool

    def _restart(self) -> None:
        """The pool stopped and its pipe closed: the next call starts both anew."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        self._close_pipe()

    def _close_pipe(self) -> None:
        for end in self._pipe:
            end.close()
        self._pipe = ()

    def score(self, responses: Sequence[str], labels: Sequence[str]) -> Tuple[torch.Tensor, Dict[str, float]]:
        """The weighted score of every response, and the metrics."""
        per_verifier, metrics = self.score_each(responses, labels)
        return self.weighted(per_verifier), metrics

    def weighted(self, per_verifier: Dict[str, torch.Tensor]) -> torch.Tensor:
        """score_i = sum_k w_k * verifier_k(i), from ``score_each``'s values."""
        return sum(weight * per_verifier[name] for name, weight in zip(self.names, self.weights))

    def score_each(
        self, responses: Sequence[str], labels: Sequence[str]
    ) -> Tuple[Dict[str, torch.Tensor], Dict[str, float]]:
        """Each verifier's value for every response (unweighted), and the metrics."""
        tasks = [(k, name, r, lab) for k, name in enumerate(self.names) for r, lab in zip(responses, labels)]
        results: List[float] = [0.0] * len(tasks)
        todo, timeouts, failures = list(range(len(tasks))), 0, 0
        while todo:
            try:
                hung, todo = self._run(todo, tasks, results)
            except BaseException:  # interrupted: the pool's pipe may still carry this call's values
                self._restart()
                raise
            if hung is not None:  # scored 0; the pool replaced, the samples it had not scored sent again
                timeouts += 1
                self._restart()
        for index, value in enumerate(results):
            if not math.isfinite(value):  # nan: the verifier raised; inf: it returned one
                if value == value:
                    self._warn_nonfinite(tasks[index][1], value)
                results[index], failures = 0.0, failures + 1
        per_verifier: Dict[str, torch.Tensor] = {}
        metrics: Dict[str, float] = {}
        n = len(responses)
        for k, name in enumerate(self.names):
            per_verifier[name] = torch.tensor(results[k * n : (k + 1) * n], dtype=torch.float32)
            metrics[f"{name}_rewards/mean"] = float(per_verifier[name].mean()) if n else 0.0
        metrics["rule_reward/timeouts"] = float(timeouts)
        metrics["rule_reward/failures"] = float(failures)
        return per_verifier, metrics

    def _run(self, todo: List[int], tasks: list, results: List[float]) -> Tuple[Optional[int], List[int]]:
        """Score tasks ``todo`` (indices into ``tasks``), split in order over the workers, into ``results``. Returns
        a sample that ran past the timeout (nothing more of its chunk arrived for that long) or None, and the
        samples of ``todo`` still unscored besides it (none when all arrived). A chunk not yet started waits on a
        worker busy with another: its deadline moves with every message."""
        pool = self._get_pool()
        chunks = [todo[w :: self.workers] for w in range(self.workers) if todo[w :: self.workers]]
        for c, chunk in enumerate(chunks):
            pool.apply_async(run_chunk, (c, [(i, *tasks[i][1:]) for i in chunk]))
        started, nexts = [False] * len(chunks), [0] * len(chunks)
        deadlines = [time.monotonic() + self.timeout] * len(chunks)
        left = len(todo)
        while left:
            # the earliest deadline; a started chunk before one that is not, at the same deadline
            late = min(
                (c for c in range(len(chunks)) if nexts[c] < len(chunks[c])),
                key=lambda c: (deadlines[c], not started[c]),
            )
            if not self._pipe[0].poll(max(0.0, deadlines[late] - time.monotonic())):
                hung = chunks[late][nexts[late]]
                return hung, [i for c, chunk in enumerate(chunks) for i in chunk[nexts[c] :] if i != hung]
            c, index, value = self._pipe[0].recv()
            now = time.monotonic()
            started[c], deadlines[c] = True, now + self.timeout
            deadlines = [d if started[k] else now + self.timeout for k, d in enumerate(deadlines)]
            if index is not None:
                results[index], nexts[c], left = value, nexts[c] + 1, left - 1
        return None, []

    def _warn_nonfinite(self, name: str, value: float) -> None:
        """Once per verifier: it returned a non-finite score (scored 0, counted in rule_reward/failures)."""
        if name not in self._warned:
            self._warned.add(name)
            print(
                f"warning: verifier {name!r} returned {value} for a sample: scored 0 and counted in "
                "rule_reward/failures (said once per verifier)",
                flush=True,
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None
        self._close_pipe()
