"""Scoring stages: how finished prompt groups get their scores before the group filter sees them (the layer
between the rollout function's rounds and the group filter).

    Immediate    scored on the spot, then to the filter (verifiers, a reward model, a judge asked inline)
    Overlapped   the judge's part asked in the scorer's judge thread (judge_config.overlap): the groups reach the
                 filter when their verdicts are in, while the rest of the batch keeps generating

The rollout source asks a stage three things: ``submit`` finished groups (it returns those ready for the filter
now), ``ready(wait)`` the groups whose scores came in since, and ``pending`` (groups still being scored).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from ...protocol import Experience
from ...utils.clock import Clock
from .trajectory import GroupRows, Trajectory

Group = List[Trajectory]
Rows = Callable[[Sequence[Sequence[Trajectory]]], Experience]  # the groups' rows as one experience
RewardMetrics = List[Tuple[int, Dict[str, float]]]  # (rows, metrics) of each scoring call of a batch


class Score(Protocol):
    """``score(exp, clock)`` sets ``exp.scores`` and returns the metrics and each verifier's values per row;
    with ``judged`` (the judge's verdicts asked earlier) it takes the judge's part from there."""

    def __call__(
        self, exp: Experience, clock: Clock, judged: "Optional[Future[Any]]" = None
    ) -> Tuple[Dict[str, float], Dict[str, torch.Tensor]]: ...


class JudgeInThread(Score, Protocol):
    """A score whose judge's part can be asked ahead, in a thread of its own (trainer/ppo/scoring.py's Scorer)."""

    def submit_judge(self, exp: Experience) -> "Future[Any]": ...


def unscored(groups: Sequence[Group]) -> List[Group]:
    """The groups with a trajectory not scored yet."""
    return [g for g in groups if any(t.score is None for t in g)]


def score_groups(
    score: Score, groups: Sequence[Sequence[Trajectory]], exp: Experience, clock: Clock, judged=None
) -> Dict[str, float]:
    """Score ``exp`` (the rows of ``groups``) and write each trajectory's score and verifier values, and each
    group's scored rows (its piece of the batch)."""
    metrics, per_verifier = score(exp, clock, judged) if judged is not None else score(exp, clock)
    scores = exp.scores
    assert scores is not None, "score() sets the experience's scores"
    for r, traj in enumerate(t for g in groups for t in g):
        traj.score = float(scores[r])
        traj.verifier_scores = {name: float(values[r]) for name, values in per_verifier.items()}
    start = 0
    for group in groups:
        rows = GroupRows([t.uid for t in group], exp.select(slice(start, start + len(group))).tight())
        start += len(group)
        for traj in group:
            traj.group_rows = rows
    return metrics


class Immediate:
    """Groups scored when they are submitted."""

    def __init__(self, score: Score, rows: Rows) -> None:
        self.score, self.rows = score, rows

    @property
    def pending(self) -> int:
        return 0

    def submit(self, groups: List[Group], clock: Clock, reward_metrics: RewardMetrics) -> List[Group]:
        todo = unscored(groups)
        if todo:
            reward_metrics.append((sum(map(len, todo)), self.score_now(todo, clock)))
        return groups

    def ready(self, clock: Clock, reward_metrics: RewardMetrics, wait: bool) -> List[Group]:
        return []

    def score_now(self, groups: Sequence[Sequence[Trajectory]], clock: Clock) -> Dict[str, float]:
        return score_groups(self.score, groups, self.rows(groups), clock)

    def metrics(self, clock: Clock) -> Dict[str, float]:
        return {}


class Overlapped(Immediate):
    """Groups whose judge verdicts are asked in the judge's thread; they are ready, oldest first, once in."""

    score: JudgeInThread

    def __init__(self, score: JudgeInThread, rows: Rows) -> None:
        super().__init__(score, rows)
        self.judging: List[Tuple[List[Group], List[Group], Experience, Future]] = []

    @property
    def pending(self) -> int:
        return sum(len(groups) for groups, *_ in self.judging)

    def submit(self, groups: List[Group], clock: Clock, reward_metrics: RewardMetrics) -> List[Group]:
        todo = unscored(groups)
        if not todo:
            return groups
        exp = self.rows(todo)
        self.judging.append((groups, todo, exp, self.score.submit_judge(exp)))
        return []

    def ready(self, clock: Clock, reward_metrics: RewardMetrics, wait: bool) -> List[Group]:
        out: List[Group] = []
        while self.judging and (wait or self.judging[0][3].done()):
            groups, unscored, exp, judged = self.judging.pop(0)
            reward_metrics.append((sum(map(len, unscored)), score_groups(self.score, unscored, exp, clock, judged)))
            out += groups
        return out

    def metrics(self, clock: Clock) -> Dict[str, float]:
        """The share of the judge's time the generation hid (judge/overlap_share)."""
        judged = clock.timing.get("timing/judge", 0.0)
        if judged <= 0:
            return {}
        return {"judge/overlap_share": max(0.0, 1.0 - clock.timing.get("timing/judge_wait", 0.0) / judged)}


def scoring_stage(score: Score, rows: Rows, overlap: bool) -> Immediate:
    """``Overlapped`` for a score with a judge asked in its own thread (``overlap``), else ``Immediate``."""
    return Overlapped(score, rows) if overlap else Immediate(score, rows)  # type: ignore[arg-type]
