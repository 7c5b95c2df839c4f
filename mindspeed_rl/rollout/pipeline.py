"""Asynchronous rollout: generation runs ahead of training, by at most ``max_head_offpolicyness`` versions.

At the start of iteration k the pipeline makes sure the batches of iterations k .. k + L are submitted
(L = max_head_offpolicyness); a batch submitted now is sampled with the current weights, version k. The
trainer then waits only for batch k (``timing/rollout_wait``) and trains on it while the rollout workers
generate the batches after it. Batch k + j is trained at version k + j, so its staleness is at most L.

The rollout workers take calls in order: the weight push after iteration k's update waits for the
generations submitted before it, so no batch is ever sampled with weights newer than its version says.

For a checkpoint the pipeline waits for every submitted batch and keeps the results (``state_dict``): a
resumed run trains on exactly the samples the uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ..protocol.rollout import GeneratedBatch, RolloutOutput, RolloutRequest


@dataclass
class Submitted:
    """One iteration's batch: its prompts (labels, budgets), the request, the policy version that samples
    it, and the handle while in flight or the result once collected."""

    iteration: int
    prompts: Any  # trainer.prompts.PromptBatch
    request: RolloutRequest
    version: int
    handle: Any = None
    result: Optional[GeneratedBatch] = None


class RolloutPipeline:
    def __init__(self, service, max_head_offpolicyness: int):
        if max_head_offpolicyness < 1:
            raise ValueError("asynchronous rollout needs max_head_offpolicyness >= 1")
        self.service, self.lag = service, max_head_offpolicyness
        self.queue: Deque[Submitted] = deque()

    def fill(self, iteration: int, make_request: Callable[[int], Tuple[Any, RolloutRequest]]) -> None:
        """Submit the batches of iterations up to ``iteration + lag`` that are not submitted yet;
        ``make_request(i)`` draws iteration i's prompts and builds its request. The run's last iterations also
        submit batches beyond its end: the final checkpoint keeps them, for a run resumed with more iterations
        to train on exactly what an uninterrupted run would have."""
        upcoming = self.queue[-1].iteration + 1 if self.queue else iteration
        while upcoming <= iteration + self.lag:
            prompts, request = make_request(upcoming)
            self.queue.append(
                Submitted(upcoming, prompts, request, self.service.version, handle=self.service.submit(request))
            )
            upcoming += 1

    def take(self, iteration: int) -> Tuple[Submitted, float]:
        """Iteration ``iteration``'s batch, waiting for it if needed; returns it and the seconds waited."""
        if not self.queue or self.queue[0].iteration != iteration:
            raise RuntimeError(
                f"asynchronous rollout: no batch submitted for iteration {iteration} "
                f"(queued: {[s.iteration for s in self.queue]})"
            )
        entry = self.queue.popleft()
        start = time.perf_counter()
        self._collect(entry)
        return entry, time.perf_counter() - start

    def _collect(self, entry: Submitted) -> None:
        if entry.result is None:
            entry.result = self.service.collect(entry.handle)
            entry.handle = None

    # ----- checkpoint ---------------------------------------------------------------------------------
    def state_dict(self) -> List[Dict]:
        """Every submitted batch with its samples (waits for those in flight)."""
        for entry in self.queue:
            self._collect(entry)
        return [
            {
                "iteration": e.iteration,
                "version": e.version,
                "prompts": dataclasses.asdict(e.prompts),
                "request": dataclasses.asdict(e.request),
                "outputs": [dataclasses.asdict(o) for o in e.result.outputs],
                "timing": dict(e.result.timing),
            }
            for e in self.queue
        ]

    def load_state_dict(self, state: List[Dict], prompt_batch: Callable[..., Any]) -> None:
        """Restore the batches a checkpoint holds (``prompt_batch(**fields)`` rebuilds their prompts)."""
        from ..config_cls.generate_config import SamplingConfig

        self.queue.clear()
        for item in state:
            request = dict(item["request"])
            if request.get("sampling") is not None:
                request["sampling"] = SamplingConfig(**request["sampling"])
            outputs = [RolloutOutput(**o) for o in item["outputs"]]
            self.queue.append(
                Submitted(
                    int(item["iteration"]),
                    prompt_batch(**item["prompts"]),
                    RolloutRequest(**request),
                    int(item["version"]),
                    result=GeneratedBatch(outputs, dict(item["timing"]), []),
                )
            )
