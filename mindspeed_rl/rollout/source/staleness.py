"""The staleness bound (rl_config.async_training.max_staleness): how old a trajectory may be when its batch trains.

A batch produced for iteration j trains at policy version j. A finished group is stale when one of its
trajectories has a generated token sampled more than ``max_staleness`` versions before that:

    stale(group, j)  <=>  min over its trajectories t, over t's generated tokens, of version  <  j - max_staleness

A stale group is dropped (its place in the batch goes to a group of a later draw) or regenerated (its
trajectories start again from their prompts with the current weights), never trained on. The decision depends
on the tokens' versions alone, so where those are deterministic (every schedule but in-flight updates) a resumed
run makes the same decisions.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .trajectory import Trajectory

Group = List[Trajectory]


class StalenessBound:
    def __init__(self, max_staleness: Optional[int] = None, policy: str = "drop") -> None:
        if policy not in ("drop", "regenerate"):
            raise ValueError(f"stale_trajectories must be drop or regenerate, got {policy!r}")
        self.max_staleness, self.policy = max_staleness, policy
        self.dropped = self.regenerated = 0  # groups, since the last metrics()

    def is_stale(self, group: Sequence[Trajectory], trains_at: int) -> bool:
        if self.max_staleness is None:
            return False
        oldest = [v for v in (t.oldest_version() for t in group) if v is not None]
        return bool(oldest) and min(oldest) < trains_at - self.max_staleness

    def screen(self, groups: Sequence[Group], trains_at: int) -> Tuple[List[Group], List[Group]]:
        """(the groups to offer, the stale groups to generate again); a dropped group is in neither."""
        fresh: List[Group] = []
        again: List[Group] = []
        for group in groups:
            if not self.is_stale(group, trains_at):
                fresh.append(list(group))
            elif self.policy == "drop":
                self.dropped += 1
            else:
                for traj in group:
                    traj.restart()
                again.append(list(group))
                self.regenerated += 1
        return fresh, again

    def metrics(self) -> Dict[str, float]:
        """The groups dropped and regenerated since the last call (async/stale_*); none without a bound."""
        if self.max_staleness is None:
            return {}
        out = {
            "async/stale_groups_dropped": float(self.dropped),
            "async/stale_groups_regenerated": float(self.regenerated),
        }
        self.dropped = self.regenerated = 0
        return out
