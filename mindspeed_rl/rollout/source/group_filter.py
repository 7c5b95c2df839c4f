"""Group filters: which finished prompt groups a batch keeps (the layer between rollout function and schedule).

The schedule offers every group whose n trajectories are done, scored, oldest first, until the filter has
the batch's ``want`` groups; it draws more prompts while the filter may still need them.

    KeepAll          every group, in the order offered
    DynamicSampling  DAPO's filter_groups: a group whose responses all score alike (zero group-relative
                     advantage) is dropped; after ``max_draws`` draws the batch is completed with dropped
                     groups (counted in dynamic_sampling/filled_groups)

A filter holds groups only while one batch is being put together; ``state_dict`` keeps them too, so a
checkpoint taken at any point restores the same batch.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from ...algorithms.shaping import informative_groups
from .trajectory import Trajectory

Group = List[Trajectory]


class GroupFilter:
    """Keeps every group it is offered (``KeepAll``); subclasses decide per group in ``keeps``."""

    name = "all"
    drops = False  # whether a group offered can be left out: then the loop waits for every score before drawing

    def __init__(self, want: int) -> None:
        self.want = want
        self.kept: List[Group] = []
        self.dropped: List[Group] = []

    def keeps(self, group: Group) -> bool:
        return True

    def offer(self, group: Group) -> None:
        (self.kept if self.keeps(group) else self.dropped).append(group)

    def satisfied(self) -> bool:
        return len(self.kept) >= self.want

    def may_draw(self, draws: int) -> bool:
        """Whether one more draw of prompts is allowed after ``draws`` draws for this batch."""
        return True

    def take(self, draws: int) -> "tuple[List[Group], Dict[str, float]]":
        """The batch's groups (kept first, then dropped ones to fill it) and the filter's metrics; the
        filter is empty afterwards."""
        batch = (self.kept + self.dropped)[: self.want]
        metrics = self.metrics(draws, len(batch) - min(len(self.kept), self.want))
        self.kept, self.dropped = [], []
        return batch, metrics

    def metrics(self, draws: int, filled: int) -> Dict[str, float]:
        return {}

    def summary(self, iteration: int, metrics: Dict[str, float], draws: int) -> Optional[str]:
        """A console line about the batch worth a reader's attention, or None."""
        return None

    # ----- checkpoint ----------------------------------------------------------------------------------
    def state_dict(self) -> Dict:
        return {
            "kept": [[t.state() for t in g] for g in self.kept],
            "dropped": [[t.state() for t in g] for g in self.dropped],
        }

    def load_state_dict(self, state: Dict) -> None:
        self.kept = [[Trajectory.from_state(t) for t in g] for g in state.get("kept", [])]
        self.dropped = [[Trajectory.from_state(t) for t in g] for g in state.get("dropped", [])]


KeepAll = GroupFilter


class DynamicSampling(GroupFilter):
    """DAPO's dynamic sampling on ``metric`` ("score" or a verifier's name); ``max_draws`` < 0: no limit."""

    name = "dynamic_sampling"
    drops = True

    def __init__(self, want: int, metric: str, max_draws: int) -> None:
        super().__init__(want)
        self.metric, self.max_draws = metric, max_draws

    def values(self, group: Sequence[Trajectory]) -> torch.Tensor:
        if self.metric == "score":
            return torch.tensor([t.score for t in group], dtype=torch.float64)
        return torch.tensor([t.verifier_scores[self.metric] for t in group], dtype=torch.float64)

    def keeps(self, group: Group) -> bool:
        return bool(informative_groups(self.values(group), torch.zeros(len(group), dtype=torch.long))[0])

    def may_draw(self, draws: int) -> bool:
        return self.max_draws < 0 or draws < self.max_draws

    def metrics(self, draws: int, filled: int) -> Dict[str, float]:
        return {
            "dynamic_sampling/batches": float(draws),
            "dynamic_sampling/kept_groups": float(min(len(self.kept), self.want)),
            "dynamic_sampling/filled_groups": float(filled),
        }

    def summary(self, iteration: int, metrics: Dict[str, float], draws: int) -> Optional[str]:
        """Said when the draw limit made dropped groups fill the batch."""
        if not metrics.get("dynamic_sampling/filled_groups"):
            return None
        return (
            f"iteration {iteration + 1}: dynamic sampling found {int(metrics['dynamic_sampling/kept_groups'])} of "
            f"{self.want} informative groups in {draws} draws (filter_groups_max_batches); "
            f"{int(metrics['dynamic_sampling/filled_groups'])} filtered groups fill the batch"
        )
