"""Partial rollout: responses grow in chunks, and the long tail waits for the next weights.

Every response is generated in chunks of ``ceil(max_tokens / partial_rollout_max_split)`` tokens. One
*round* gives every unfinished response of the pool one more chunk, all in one generation call. Rounds
repeat until enough prompt groups (all n responses of a prompt) have finished for the batch; before a
round, a global batch of new prompts joins the pool when fewer groups than the batch needs are still
growing (the long tail then grows beside fresh prompts instead of holding the engines alone). The batch takes
the oldest finished groups;
everything else stays in the pool, parked with its tokens, the per-token log-probs it was sampled with
and the policy version of each token, and continues with the next iteration's weights.

A response finishes on a stop token or at its budget, so after ``partial_rollout_max_split`` chunks at
the latest, and every unfinished response gets a chunk in every round. An iteration may need no round
at all (groups that finished beyond the last batch fill it); with ``require_max_age_all_finished`` it
still runs rounds until every response at the maximum age (``partial_rollout_max_split - 1`` iterations
parked) has finished, so a response finishes within ``partial_rollout_max_split`` iterations.

The pool is plain data (``state_dict``): a checkpoint holds it, and a resume continues every parked
response exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..protocol.rollout import RolloutOutput


@dataclass
class Trajectory:
    """One response in the making, with everything needed to continue it or to train on it."""

    uid: int  # the response's number in the run; its prompt group is uid // n
    prompt: List[int]
    label: str
    budget: int  # response tokens it may have in total
    response_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)  # policy version that sampled each token
    finished: bool = False
    finish_reason: str = "length"
    age: int = 0  # iterations it has been parked (carried over unfinished or unused)

    def remaining(self) -> int:
        return self.budget - len(self.response_ids)

    def extend(self, out: RolloutOutput, version: int) -> None:
        """Append one chunk; finished on a stop token, at the budget, or when the engine returned nothing."""
        self.response_ids += list(out.response_ids)
        self.logprobs += list(out.logprobs)
        self.versions += [version] * len(out.response_ids)
        if out.finish_reason == "stop" or self.remaining() <= 0 or not out.response_ids:
            self.finished, self.finish_reason = True, out.finish_reason if out.response_ids else "length"


@dataclass
class ChunkRequest:
    """One round's generation call: each unfinished response's prompt + tokens so far, its chunk size,
    and the base seed (request j is seeded ``seed + j``)."""

    prompts: List[List[int]]
    max_new_tokens: List[int]
    seed: int


@dataclass
class PartialBatch:
    """The groups an iteration trains on, in group order: one prompt and label per group, n outputs each
    (prompt indices local to the batch, per-token versions set)."""

    prompts: List[List[int]]
    labels: List[str]
    outputs: List[RolloutOutput]
    metrics: Dict[str, float]


Generate = Callable[[ChunkRequest], List[RolloutOutput]]
DrawPrompts = Callable[[], Tuple[Sequence[Sequence[int]], Sequence[str], Optional[Sequence[int]]]]


class PartialRollout:
    """The pool of responses in flight and the rounds that grow them (driver side, engine-agnostic)."""

    def __init__(self, n: int, max_tokens: int, max_split: int, require_max_age_all_finished: bool = True):
        if max_split < 1:
            raise ValueError(f"partial_rollout_max_split must be >= 1, got {max_split}")
        self.n, self.max_tokens, self.max_split = n, max_tokens, max_split
        self.require_max_age_all_finished = require_max_age_all_finished
        self.chunk = math.ceil(max_tokens / max_split)
        self.pool: List[Trajectory] = []
        self.next_uid = 0

    # ----- pool --------------------------------------------------------------------------------------
    def add_prompts(
        self, prompts: Sequence[Sequence[int]], labels: Sequence[str], budgets: Optional[Sequence[int]] = None
    ) -> None:
        """n new responses per prompt (a prompt's own budget caps max_tokens)."""
        for i, prompt in enumerate(prompts):
            budget = min(self.max_tokens, int(budgets[i])) if budgets is not None else self.max_tokens
            for _ in range(self.n):
                self.pool.append(Trajectory(self.next_uid, list(prompt), labels[i], max(1, budget)))
                self.next_uid += 1

    def groups(self) -> Dict[int, List[Trajectory]]:
        """The pool's prompt groups by group id, oldest (lowest id) first."""
        out: Dict[int, List[Trajectory]] = {}
        for traj in sorted(self.pool, key=lambda t: t.uid):
            out.setdefault(traj.uid // self.n, []).append(traj)
        return out

    def finished_groups(self) -> List[int]:
        return [g for g, members in self.groups().items() if all(t.finished for t in members)]

    def unfinished_groups(self) -> int:
        return sum(not all(t.finished for t in members) for members in self.groups().values())

    def max_age_unfinished(self) -> bool:
        """A response at the maximum age is still unfinished (require_max_age_all_finished waits for it)."""
        return any(not t.finished and t.age >= self.max_split - 1 for t in self.pool)

    # ----- one round ----------------------------------------------------------------------------------
    def chunk_request(self, seed: int) -> Tuple[List[Trajectory], ChunkRequest]:
        active = [t for t in self.pool if not t.finished]
        return active, ChunkRequest(
            [t.prompt + t.response_ids for t in active], [min(self.chunk, t.remaining()) for t in active], seed
        )

    def run_round(self, generate: Generate, seed: int, version: int) -> int:
        """One chunk for every unfinished response; returns the tokens generated."""
        active, request = self.chunk_request(seed)
        if not active:
            return 0
        outputs = generate(request)
        by_index = {out.prompt_index: out for out in outputs}
        if sorted(by_index) != list(range(len(active))):
            raise RuntimeError(f"partial rollout: {len(outputs)} outputs for {len(active)} requests")
        for j, traj in enumerate(active):
            traj.extend(by_index[j], version)
        return sum(len(out.response_ids) for out in outputs)

    # ----- one iteration ------------------------------------------------------------------------------
    def next_batch(
        self, want_groups: int, draw: DrawPrompts, generate: Generate, version: int, round_seed: Callable[[int], int]
    ) -> PartialBatch:
        """Rounds until ``want_groups`` groups have finished (drawing prompts while fewer than that are growing),
        then the oldest finished groups; the rest stays parked. ``round_seed(r)`` seeds round r."""
        rounds = tokens = drawn = 0
        while True:
            finished = len(self.finished_groups())
            waiting_on_oldest = self.require_max_age_all_finished and self.max_age_unfinished()
            if finished >= want_groups and not waiting_on_oldest:
                break
            if finished < want_groups and self.unfinished_groups() < want_groups:
                prompts, labels, budgets = draw()  # keep a batch's worth of groups growing
                self.add_prompts(prompts, labels, budgets)
                drawn += len(prompts)
                continue
            tokens += self.run_round(generate, round_seed(rounds), version)
            rounds += 1
        taken = self.finished_groups()[:want_groups]
        members = self.groups()
        batch: List[Trajectory] = [t for g in taken for t in members[g]]
        chosen = {t.uid for t in batch}
        self.pool = [t for t in self.pool if t.uid not in chosen]
        for traj in self.pool:
            traj.age += 1
        outputs = [
            RolloutOutput(i // self.n, t.response_ids, t.logprobs, t.finish_reason, versions=t.versions)
            for i, t in enumerate(batch)
        ]
        carried = [t for t in batch if t.age > 0]
        metrics = {
            "partial_rollout/rounds": float(rounds),
            "partial_rollout/generated_tokens": float(tokens),
            "partial_rollout/drawn_prompts": float(drawn),
            "partial_rollout/parked": float(sum(not t.finished for t in self.pool)),
            "partial_rollout/finished_waiting": float(sum(t.finished for t in self.pool)),
            "partial_rollout/carried_share": len(carried) / max(1, len(batch)),
            "partial_rollout/max_age": float(max((t.age for t in batch), default=0)),
        }
        return PartialBatch(
            [batch[i].prompt for i in range(0, len(batch), self.n)],
            [batch[i].label for i in range(0, len(batch), self.n)],
            outputs,
            metrics,
        )

    # ----- checkpoint ---------------------------------------------------------------------------------
    def state_dict(self) -> Dict:
        return {"next_uid": self.next_uid, "n": self.n, "pool": [dataclasses.asdict(t) for t in self.pool]}

    def load_state_dict(self, state: Dict) -> None:
        if int(state["n"]) != self.n:
            raise ValueError(
                f"the checkpoint's partial-rollout pool has groups of {state['n']} responses, "
                f"this run samples {self.n} per prompt (rl_config.n_samples_per_prompt)"
            )
        self.next_uid = int(state["next_uid"])
        self.pool = [Trajectory(**t) for t in state["pool"]]
