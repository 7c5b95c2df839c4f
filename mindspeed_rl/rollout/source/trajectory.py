"""The one trajectory type every rollout function, filter and schedule works on.

A trajectory is a prompt's response in the making, kept token in, token out: the engine's tokens exactly
as generated (loss_mask 1, their sampling log-probs and the policy version that sampled each) and, for
multi-turn rollouts, the tool results appended between turns (loss_mask 0, log-prob 0, the version of the
turn that asked for them). Its status says what a schedule may do with it:

    interrupted   not done: generation stopped at a chunk's end, or its turn's tools are running, or it has
                  not started; a schedule continues it (partial rollout parks it across iterations)
    finished      ended on its own: a stop token, an answer without tool calls, the turn or call limit
    cut           ended at its token budget

Everything but ``group_rows`` is plain data: ``state()`` / ``from_state()`` round-trip it through a checkpoint.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from ...protocol.experience import Experience
from ...protocol.rollout import RolloutOutput

INTERRUPTED, FINISHED, CUT = "interrupted", "finished", "cut"
STATUSES = (INTERRUPTED, FINISHED, CUT)


@dataclass
class GroupRows:
    """A scored group's experience rows (its trajectories' uids in row order), made once when the group was
    scored: the scorer's input, then the group's piece of the batch."""

    uids: List[int]
    rows: Experience


@dataclass
class Trajectory:
    uid: int  # the trajectory's number in the run; its prompt group is uid // n
    prompt: List[int]
    label: str
    budget: int  # response tokens it may hold in total (generated and tool results)
    tools: Optional[List[str]] = None  # tools its prompt may call (None: all configured)
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    loss_mask: List[int] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)
    status: str = INTERRUPTED
    finish_reason: str = "length"  # the engine's, for a trajectory that is done ("stop" or "length")
    turns: int = 0  # assistant turns ended
    turn_start: int = 0  # where the current assistant turn begins in ``tokens``
    calls: int = 0  # tool calls run
    tool_errors: Dict[str, int] = field(default_factory=dict)  # error kind -> count
    observation_tokens: int = 0
    age: int = 0  # iterations it has been parked (partial rollout)
    score: Optional[float] = None  # set once its group is scored
    verifier_scores: Dict[str, float] = field(default_factory=dict)
    # router replay: the engine's routes over prompt + tokens, from its latest forward of this trajectory
    # (int16 [positions, MoE layers, top-k]; each turn's forward covers the whole context again)
    routes: Optional[Any] = None
    images: bytes = b""  # its prompt's images as the dataset stores them (a parked trajectory keeps them)
    reward: Optional[float] = None  # an outside agent's reward for it (openai_agent), added to its score
    dropped: str = ""  # why the rollout function gave it up (an outside agent's failure): its group is left out
    source_prompt: Optional[List[int]] = None  # the dataset's prompt, where an outside agent's rendering replaced it
    group_rows: Optional[GroupRows] = field(default=None, repr=False, compare=False)  # not checkpointed

    @property
    def done(self) -> bool:
        return self.status != INTERRUPTED

    def remaining(self) -> int:
        return self.budget - len(self.tokens)

    def generation_input(self) -> List[int]:
        return self.prompt + self.tokens

    def append(
        self,
        tokens: Sequence[int],
        logprobs: Sequence[float],
        version: Union[int, Sequence[int]],
        trained: bool,
        routes: Any = None,
    ) -> None:
        """Generated tokens (trained, with their log-probs and the engine's routes of the whole context) or a
        tool result (loss_mask 0, log-prob 0); ``version``: the policy version of all of them, or of each (an
        in-flight weight update changed it mid-answer)."""
        if routes is not None:
            self.routes = routes
        self.tokens += list(tokens)
        self.logprobs += list(logprobs) if trained else [0.0] * len(tokens)
        self.loss_mask += [int(trained)] * len(tokens)
        if isinstance(version, int):
            self.versions += [version] * len(tokens)
        elif len(version) == len(tokens):
            self.versions += list(version)
        else:
            raise ValueError(f"trajectory {self.uid}: {len(version)} versions for {len(tokens)} tokens")

    def oldest_version(self) -> Optional[int]:
        """The version of its oldest generated (trained) token; None before it has any."""
        trained = [v for v, m in zip(self.versions, self.loss_mask) if m]
        return min(trained) if trained else None

    def restart(self) -> None:
        """Back to its prompt alone (a stale trajectory regenerated with the current weights)."""
        prompt = self.source_prompt if self.source_prompt is not None else self.prompt
        blank = Trajectory(self.uid, prompt, self.label, self.budget, self.tools, images=self.images)
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(blank, f.name))

    def end(self, status: str, finish_reason: str) -> None:
        self.status, self.finish_reason = status, finish_reason

    def end_with(self, finish_reason: str) -> None:
        """Ended as the engine says: finished on a stop token, cut otherwise (at the budget)."""
        self.end(FINISHED if finish_reason == "stop" else CUT, finish_reason)

    def count_error(self, kind: str, count: int = 1) -> None:
        if count:
            self.tool_errors[kind] = self.tool_errors.get(kind, 0) + count

    def output(self, prompt_index: int) -> RolloutOutput:
        return RolloutOutput(
            prompt_index,
            list(self.tokens),
            list(self.logprobs),
            self.finish_reason,
            list(self.versions),
            list(self.loss_mask),
            self.routes,
        )

    def state(self) -> Dict:
        state = dataclasses.asdict(dataclasses.replace(self, group_rows=None))
        del state["group_rows"]
        state["images"] = base64.b64encode(self.images).decode("ascii")  # plain data: JSON-safe
        return state

    @staticmethod
    def from_state(state: Dict) -> "Trajectory":
        traj = Trajectory(**{**state, "images": base64.b64decode(state.get("images") or "")})
        if traj.status not in STATUSES:
            raise ValueError(f"trajectory {traj.uid}: unknown status {traj.status!r}")
        return traj


def group_outputs(groups: Sequence[Sequence[Trajectory]]):
    """(prompts, labels, outputs) of whole prompt groups, outputs numbered by group (build_experience's input);
    ``prompts`` one per trajectory when a group's differ (an outside agent's own rendering of its task)."""
    prompts = [g[0].prompt for g in groups]
    if any(t.prompt != g[0].prompt for g in groups for t in g):
        prompts = [t.prompt for g in groups for t in g]
    labels = [g[0].label for g in groups]
    outputs = [t.output(i) for i, g in enumerate(groups) for t in g]
    return prompts, labels, outputs


def request_images(trajectories: Sequence[Trajectory]) -> Optional[List[bytes]]:
    """The images of a request's trajectories in order, or None when none has any (a text request)."""
    return [t.images for t in trajectories] if any(t.images for t in trajectories) else None
