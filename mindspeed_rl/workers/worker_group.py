"""The Ray actors of one role and the rules for splitting work over them.

Three axes, one method each:

- ``generate``: prompts split by rollout engine (infer DP). Every rank of an engine receives the same
  requests (the engine's TP ranks run one model together); the engine's first rank returns the outputs.
- ``forward``: experience rows split by train DP. Every rank of a DP group (its TP x PP ranks)
  receives the same rows; the group's output rank (TP 0, last PP stage) returns the result.
- ``update``: each mini-batch split by train DP, with the whole mini-batch's token count attached.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..algorithms.losses import LossScale
from ..models.packing import balanced_split, restore_order
from ..protocol import (
    MODEL_INPUTS,
    Experience,
    ForwardAnswer,
    GeneratedBatch,
    MiniBatch,
    RankLayout,
    RolloutOutput,
    RolloutRequest,
    RolloutResult,
    slowest,
    split_rows,
)


class DispatchError(RuntimeError):
    """The workers' answers break the dispatch contract (a bug, never a user error)."""


@dataclass
class PendingGeneration:
    """A generate call in flight: every rank's result reference and how prompts were split over engines."""

    refs: List[Any]
    engines: List[List[int]]
    firsts: List[int]


@dataclass
class PendingForward:
    """A forward in flight: every rank's result reference and each DP group's rows (experience row indices)."""

    refs: List[Any]
    shares: List[np.ndarray]


def engine_prompt_split(num_prompts: int, engines: int) -> List[np.ndarray]:
    """Contiguous, near-equal prompt ranges, one per engine."""
    return np.array_split(np.arange(num_prompts), engines)


class WorkerGroup:
    """The Ray actors of one role, in rank order; calls fan out and are gathered."""

    def __init__(self, name: str, handles: List[Any], layouts: Optional[List[RankLayout]] = None):
        self.name, self.handles = name, handles
        self.layouts: List[RankLayout] = list(layouts or [])

    # ----- plain calls ------------------------------------------------------------------------------
    def call(self, method: str, *args, per_rank: Sequence[tuple] = None, **kwargs) -> List[Any]:
        """``method`` on every rank (the same arguments, or ``per_rank[r]`` for rank r); results by rank."""
        import ray

        return ray.get(self.call_async(method, *args, per_rank=per_rank, **kwargs))

    def call_async(self, method: str, *args, per_rank: Sequence[tuple] = None, **kwargs) -> List[Any]:
        """As ``call``, without waiting: the result references by rank."""
        if per_rank is not None:
            return [getattr(h, method).remote(*a, **kwargs) for h, a in zip(self.handles, per_rank)]
        return [getattr(h, method).remote(*args, **kwargs) for h in self.handles]

    def load_layouts(self, timeout_s: Optional[float] = None, key: str = "") -> None:
        """Every rank's layout, read once the rank is built; TimeoutError naming the ranks not built within
        ``timeout_s`` seconds (and ``key``, the setting that bounds it)."""
        import ray

        refs = self.call_async("layout")
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            late = [rank for rank, ref in enumerate(refs) if ref not in ready]
            within = f"{key} = {timeout_s:g} s" if key else f"{timeout_s:g} s"
            raise TimeoutError(f"the {self.name} workers of rank {late} were not built within {within}")
        self.layouts = ray.get(refs)

    # ----- layout -----------------------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        return self.layouts[0].dp_size

    def output_ranks(self) -> List[int]:
        """For each DP rank in order, the rank whose results hold that DP group's outputs."""
        by_dp = {lay.dp_rank: lay.rank for lay in self.layouts if lay.output}
        return [by_dp[dp] for dp in range(self.dp_size)]

    def engines(self) -> List[List[int]]:
        """The ranks of each rollout engine, engine by engine (rank order inside each)."""
        groups: Dict[int, List[int]] = {}
        for lay in sorted(self.layouts, key=lambda layout: (layout.engine, layout.engine_rank)):
            if lay.engine >= 0:
                groups.setdefault(lay.engine, []).append(lay.rank)
        return [groups[e] for e in sorted(groups)]

    # ----- generation: by engine ------------------------------------------------------------------------
    def generate(self, request: RolloutRequest, version: Optional[int] = None) -> GeneratedBatch:
        """Generate ``request``, waiting for it (see ``submit_generate``)."""
        return self.collect_generate(self.submit_generate(request, version))

    def submit_generate(self, request: RolloutRequest, version: Optional[int] = None) -> PendingGeneration:
        """Start generating ``request`` on every engine. Engine e gets its part (a contiguous range of prompts,
        ``RolloutRequest.part``): the sample with global index j = prompt x n + k is seeded ``seed + j`` whatever
        the number of engines; each prompt's budget goes with it. ``version``: the policy version the engines must
        hold (resharded from the actor when they hold another; None: always)."""
        import ray

        engines = self.engines()
        if not engines:
            raise DispatchError(f"worker group {self.name} has no rollout engines")
        ranges = engine_prompt_split(len(request.prompts), len(engines))
        firsts = [int(rows[0]) if len(rows) else 0 for rows in ranges]  # each engine's first global prompt
        args: List[Optional[tuple]] = [None] * len(self.handles)
        for engine, ranks in enumerate(engines):
            part = ray.put(request.part(ranges[engine]))  # one object-store copy per engine
            for rank in ranks:
                args[rank] = (part, version)
        return PendingGeneration(self.call_async("generate", per_rank=args), engines, firsts)

    def collect_generate(self, pending: PendingGeneration) -> GeneratedBatch:
        """Wait for a submitted generation: every engine's outputs with global prompt indices."""
        import ray

        results: List[RolloutResult] = ray.get(pending.refs)
        outputs: List[RolloutOutput] = []
        for engine, ranks in enumerate(pending.engines):
            digests = {results[r].request_digest for r in ranks}
            if len(digests) != 1:
                raise DispatchError(f"{self.name} engine {engine}: ranks {ranks} received different requests")
            leader = results[ranks[0]]
            if leader.outputs is None:
                raise DispatchError(f"{self.name} engine {engine}: rank {ranks[0]} returned no outputs")
            for out in leader.outputs:
                outputs.append(dataclasses.replace(out, prompt_index=out.prompt_index + pending.firsts[engine]))
        return GeneratedBatch(outputs, slowest(r.timing for r in results), results)

    # ----- forwards and updates: by train DP ------------------------------------------------------------
    def forward(
        self, method: str, experience: Experience, fields: Sequence[str] = MODEL_INPUTS, *extra, balance: bool = False
    ) -> ForwardAnswer:
        """``method(rows, *extra)`` with each DP group's share of the rows; the output ranks' answers joined
        in the experience's row order (timings: the slowest group's). With ``balance`` the shares have
        near-equal token sums (use_dp_batch_balance), else they are contiguous."""
        return self.collect_forward(self.submit_forward(method, experience, fields, *extra, balance=balance))

    def submit_forward(
        self,
        method: str,
        experience: Experience,
        fields: Sequence[str] = MODEL_INPUTS,
        *extra,
        balance: bool = False,
        **kwargs,
    ) -> PendingForward:
        """As ``forward``, without waiting (``kwargs`` go to every rank's call)."""
        if balance and self.dp_size > 1:
            shares = balanced_split(experience.attention_mask.sum(1).tolist(), self.dp_size)
        else:
            shares = split_rows(experience.num_rows, self.dp_size)
        refs = self.submit_per_dp(method, [experience.select(rows, fields) for rows in shares], extra, **kwargs)
        return PendingForward(refs, shares)

    def collect_forward(self, pending: PendingForward) -> ForwardAnswer:
        """Wait for a submitted forward: its answer as ``forward`` gives it."""
        import ray

        results = ray.get(pending.refs)
        answers: List[ForwardAnswer] = [results[rank] for rank in self.output_ranks()]
        joined = restore_order(
            torch.cat([answer.per_row for answer in answers]), torch.as_tensor(np.concatenate(pending.shares))
        )
        return ForwardAnswer(joined, slowest(answer.timing for answer in answers), answers[0].metrics)

    def update(self, method: str, experience: Experience, plan: Sequence[np.ndarray], *args, **options) -> Any:
        """``submit_update``, waiting for the first output rank's answer."""
        return self.collect_update(self.submit_update(method, experience, plan, *args, **options))

    def submit_update(
        self,
        method: str,
        experience: Experience,
        plan: Sequence[np.ndarray],
        fields: Sequence[str],
        *extra,
        horizon: Optional[float] = None,
        balance: bool = False,
        **kwargs,
    ) -> List[Any]:
        """One optimizer step per mini-batch of ``plan`` (row indices): each DP rank gets its share and the
        whole mini-batch's counts (valid tokens, responses, and ``horizon``, the fixed length of
        seq-mean-token-sum-norm; default the response width); ``balance`` gives the DP ranks near-equal token
        sums (use_dp_batch_balance); ``kwargs`` go to every rank's call. Returns every rank's result reference
        without waiting (metrics are reduced across DP inside the engine)."""
        per_dp: List[List[MiniBatch]] = [[] for _ in range(self.dp_size)]
        for rows in plan:
            scale = LossScale.of(experience.loss_mask[rows], horizon)
            rows = np.asarray(rows)
            parts = (
                [rows[share] for share in balanced_split(experience.attention_mask[rows].sum(1).tolist(), self.dp_size)]
                if balance
                else np.array_split(rows, self.dp_size)
            )
            for dp, part in enumerate(parts):
                per_dp[dp].append(MiniBatch(experience.select(part, fields), scale))
        return self.submit_per_dp(method, per_dp, extra, **kwargs)

    def collect_update(self, refs: List[Any]) -> Any:
        """Wait for a submitted update: the first output rank's answer."""
        import ray

        return ray.get(refs)[self.output_ranks()[0]]

    def submit_per_dp(self, method: str, per_dp: Sequence[Any], extra: tuple, **kwargs) -> List[Any]:
        """``method(per_dp[d], *extra, **kwargs)`` on every rank of DP group d (one object-store copy per group),
        without waiting: the result references by rank."""
        import ray

        shares = [ray.put(value) for value in per_dp]
        return self.call_async(method, per_rank=[(shares[lay.dp_rank],) + extra for lay in self.layouts], **kwargs)

    def call_per_dp(self, method: str, per_dp: Sequence[Any], extra: tuple) -> List[Any]:
        """``method(per_dp[d], *extra)`` on every rank of DP group d, waiting: the results by rank."""
        import ray

        return ray.get(self.submit_per_dp(method, per_dp, extra))

    def describe_engines(self) -> str:
        return ", ".join(f"engine {e}: ranks {ranks}" for e, ranks in enumerate(self.engines()))
