"""The trajectories in flight and the rounds that advance them (driver side, engine-agnostic).

One *round* is one generation call: every trajectory that is ready (not done, no tools running) gets at
most ``chunk`` more tokens (a schedule's chunk, or the rest of its budget), then the rollout function
absorbs each answer. Tool work that a round's ended turns ask for starts in the pool's tool thread at
once and runs while the next round generates; its results are appended after that round returns, and the
trajectory joins the round after. When no trajectory is ready the round first waits for the tools. The
rounds' composition therefore depends on the trajectories only, never on how fast a tool was: seeds and
batches are the same in every run, and a resumed run repeats them exactly.

Request j of a round is seeded ``seed + j`` (the ready trajectories in uid order; the source hands out the
seeds of a run in order, so no two samples share one).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...config_cls.base import ConfigError
from ...config_cls.generate_config import SamplingConfig
from ...datasets.prompt_dataset import PromptBatch
from ...protocol.rollout import RolloutRequest, by_prompt
from ...utils.clock import Clock
from .agent_loop import RolloutFunction
from .trajectory import Trajectory, request_images


class TrajectoryPool:
    """Trajectories grouped by prompt (n each, uids ``group * n + k``), in flight between rounds."""

    def __init__(self, function: RolloutFunction, n: int, max_tokens: int) -> None:
        self.function, self.n, self.max_tokens = function, n, max_tokens
        self.trajectories: List[Trajectory] = []
        self.next_uid = 0
        self._tools: List[Tuple[Future, List[Tuple[Trajectory, object]]]] = []  # tool work running, by batch
        self._opening: List[Tuple[Trajectory, object]] = []  # new trajectories' work before their first round
        self._executor: Optional[ThreadPoolExecutor] = None
        self.meter: Optional[Any] = None  # an EngineMeter (production.py) that each round's generation time goes to

    # ----- contents ------------------------------------------------------------------------------------
    def add(self, prompts: PromptBatch) -> None:
        """n new trajectories per prompt (a prompt's own budget caps max_tokens)."""
        for i, prompt in enumerate(prompts.input_ids):
            budget = self.max_tokens
            if prompts.max_new_tokens is not None:
                budget = min(budget, int(prompts.max_new_tokens[i]))
            tools = prompts.tools[i] if prompts.tools is not None else None
            images = prompts.images[i] if prompts.images is not None else b""
            for _ in range(self.n):
                traj = Trajectory(self.next_uid, list(prompt), prompts.labels[i], max(1, budget), tools, images=images)
                self.trajectories.append(traj)
                self.next_uid += 1
                self._open(traj)

    def _open(self, traj: Trajectory) -> None:
        """The rollout function's work before ``traj``'s first round (an outside agent's start), if any."""
        if not traj.done:
            work = self.function.open(traj)
            if work is not None:
                self._opening.append((traj, work))

    def groups(self) -> Dict[int, List[Trajectory]]:
        """Prompt groups by group id, oldest (lowest id) first."""
        out: Dict[int, List[Trajectory]] = {}
        for traj in sorted(self.trajectories, key=lambda t: t.uid):
            out.setdefault(traj.uid // self.n, []).append(traj)
        return out

    def finished_groups(self) -> List[int]:
        return [g for g, members in self.groups().items() if all(t.done for t in members)]

    def growing_groups(self) -> int:
        return sum(not all(t.done for t in members) for members in self.groups().values())

    def unfinished(self) -> bool:
        return any(not t.done for t in self.trajectories)

    def oldest_unfinished(self, max_age: int) -> bool:
        """A trajectory parked ``max_age`` iterations or more is not done yet."""
        return any(not t.done and t.age >= max_age for t in self.trajectories)

    def take(self, group_ids: Sequence[int]) -> List[List[Trajectory]]:
        """Remove whole groups from the pool, in the given order."""
        members, wanted = self.groups(), set(group_ids)
        self.trajectories = [t for t in self.trajectories if t.uid // self.n not in wanted]
        return [members[g] for g in group_ids]

    def put_back(self, groups: Sequence[Sequence[Trajectory]], restarted: bool = False) -> None:
        """Groups back into the pool; ``restarted``: they start again from their prompts (the rollout function
        opens them again: an outside agent's new episode)."""
        self.trajectories = sorted(self.trajectories + [t for g in groups for t in g], key=lambda t: t.uid)
        if restarted:
            for traj in (t for g in groups for t in g):
                self._open(traj)

    # ----- rounds --------------------------------------------------------------------------------------
    def run_round(
        self, service, seed, version: int, chunk: int, clock: Clock, sampling: Optional[SamplingConfig] = None
    ) -> int:
        """One generation call over the ready trajectories; returns the tokens generated (0: nothing ran).
        ``seed``: the round's base seed, or a stream (``take(rows)``) that hands out the next rows' seeds."""
        if self._opening:
            self._start_tools(self._opening)
            self._opening = []
        waiting = {id(t) for _, works in self._tools for t, _ in works}
        ready = [t for t in self.trajectories if not t.done and id(t) not in waiting]
        if not ready and self._tools:
            self.join_tools(version, clock)
            ready = [t for t in self.trajectories if not t.done]
        if not ready:
            return 0
        ready.sort(key=lambda t: t.uid)
        if not isinstance(seed, int):
            seed = seed.take(len(ready))
        if self.function.whole_batch:
            return self._whole_batch(ready, service, seed, version, clock, sampling)
        request = RolloutRequest(
            [t.generation_input() for t in ready],
            1,
            seed,
            sampling,
            [min(chunk, t.remaining()) for t in ready],
            request_images(ready),
        )
        generated = self._generate(service, request, clock)
        for key in ("timing/resharding_to_infer", "timing/resharding_to_train"):
            if key in generated.timing:
                clock.add(key, generated.timing[key])
        if self._tools:  # the previous round's tools ran while this round generated
            self.join_tools(version, clock)
        by_index = {out.prompt_index: out for out in generated.outputs}
        if sorted(by_index) != list(range(len(ready))):
            raise RuntimeError(f"rollout round: {len(generated.outputs)} outputs for {len(ready)} requests")
        works = []
        for j, traj in enumerate(ready):
            work = self.function.absorb(traj, by_index[j], version)
            if work is not None and not traj.done:
                works.append((traj, work))
        if works:
            self._start_tools(works)
        return sum(len(out.response_ids) for out in generated.outputs)

    def _generate(self, service, request: RolloutRequest, clock: Clock):
        """One generation call, its time on ``clock`` (timing/rollout) and on the engine meter."""
        started = time.perf_counter()
        with clock.measure("timing/rollout"):
            generated = service.collect(service.submit(request))
        if self.meter is not None:
            self.meter.add(time.perf_counter() - started)
        return generated

    def _start_tools(self, works: List[Tuple[Trajectory, object]]) -> None:
        """Run ``works`` in the tool threads (two: a batch of new trajectories' openings may run beside a batch of
        turns' tools; each batch is joined whole, in the order started)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(2, thread_name_prefix="rollout-tools")

        def run():
            start = time.perf_counter()
            results = self.function.run_tools([w for _, w in works])
            return results, time.perf_counter() - start

        self._tools.append((self._executor.submit(run), works))

    def join_tools(self, version: int, clock: Clock) -> None:
        """Wait for the running tools and append their results (``timing/tool_wait``: the time waited); new
        trajectories' openings that have not started run now too."""
        if self._opening:
            self._start_tools(self._opening)
            self._opening = []
        batches, self._tools = self._tools, []
        for future, works in batches:
            with clock.measure("timing/tool_wait"):
                results, seconds = future.result()
            clock.add("timing/tool", seconds)
            for (traj, work), result in zip(works, results):
                self.function.observe(traj, work, result, version)

    def _whole_batch(self, ready, service, seed, version, clock, sampling) -> int:
        """A whole-batch function: the new groups as one request of n per prompt, returned whole."""
        if any(t.tokens for t in ready) or len(ready) % self.n:
            raise RuntimeError(f"the whole-batch rollout function {self.function.name} cannot continue trajectories")
        groups = [ready[i : i + self.n] for i in range(0, len(ready), self.n)]
        firsts = [g[0] for g in groups]
        request = RolloutRequest(
            [t.prompt for t in firsts], self.n, seed, sampling, [t.budget for t in firsts], request_images(firsts)
        )

        def generate(req: RolloutRequest):
            return self._generate(service, req, clock).outputs

        batch = self.function.run_batch(request, generate, [g[0].tools for g in groups])
        grouped = by_prompt(batch.outputs)
        for i, group in enumerate(groups):
            outs = grouped.get(i, [])
            if len(outs) != self.n:
                raise RuntimeError(
                    f"rollout function {self.function.name}: prompt {i} has {len(outs)} of {self.n} outputs"
                )
            for traj, out in zip(group, outs):
                traj.append(
                    out.response_ids, out.logprobs, out.versions or version, trained=True, routes=out.routed_experts
                )
                if out.loss_mask is not None:  # the function's own mask (its tool results 0)
                    traj.loss_mask = list(out.loss_mask)
                traj.end_with(out.finish_reason)
        for key, value in batch.metrics.items():
            if key.startswith("timing/"):
                clock.add(key, value)
        return sum(len(out.response_ids) for out in batch.outputs)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # ----- checkpoint ----------------------------------------------------------------------------------
    def state_dict(self) -> Dict:
        if self._tools or self._opening:
            raise RuntimeError("the trajectory pool is saved with tools running: join them first")
        return {"n": self.n, "next_uid": self.next_uid, "trajectories": [t.state() for t in self.trajectories]}

    def load_state_dict(self, state: Dict) -> None:
        if int(state["n"]) != self.n:
            raise ConfigError(
                "rl_config.n_samples_per_prompt",
                f"{self.n}, but the checkpoint's rollout pool has groups of {state['n']} responses: resume with "
                f"{state['n']}",
            )
        self.next_uid = int(state["next_uid"])
        self.trajectories = [Trajectory.from_state(t) for t in state["trajectories"]]
        for traj in self.trajectories:
            self._open(traj)
