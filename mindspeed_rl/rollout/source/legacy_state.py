"""Readers of checkpoints written before the rollout source kept its own state (``trainer_state.rollout_source``):
the partial-rollout pool (``trainer_state.partial_rollout``) and the batches produced ahead
(``trainer_state.async_rollout``), turned into today's trajectories and productions."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ...datasets.prompt_dataset import PromptBatch
from ...protocol import RolloutOutput, by_prompt
from ...utils.clock import Clock
from .production import Produced
from .trajectory import Trajectory


def legacy_source_state(trainer_state: Dict, n: int) -> Tuple[Optional[Dict], List[Produced]]:
    """(the pool's state or None, the batches produced ahead) of an old checkpoint's trainer state."""
    legacy = trainer_state.get("partial_rollout")
    pool = None
    if legacy:
        trajectories = [from_partial_pool(t).state() for t in legacy["pool"]]
        pool = {"n": legacy["n"], "next_uid": legacy["next_uid"], "trajectories": trajectories}
    return pool, [legacy_async_batch(b, n) for b in trainer_state.get("async_rollout") or []]


def from_partial_pool(item: Dict) -> Trajectory:
    """A response of a checkpoint written before trajectories had one type (``trainer_state.partial_rollout``)."""
    tokens = list(item["response_ids"])
    traj = Trajectory(
        int(item["uid"]),
        list(item["prompt"]),
        item["label"],
        int(item["budget"]),
        tokens=tokens,
        logprobs=list(item["logprobs"]),
        loss_mask=[1] * len(tokens),
        versions=list(item["versions"]),
        finish_reason=item["finish_reason"],
        age=int(item["age"]),
    )
    if item["finished"]:
        traj.end_with(item["finish_reason"])
    return traj


def legacy_async_batch(item: Dict, n: int) -> Produced:
    """A batch of ``trainer_state.async_rollout`` (written before batches came from a source)."""
    prompts = PromptBatch(**item["prompts"])
    version = int(item["version"])
    grouped = by_prompt(RolloutOutput(**out) for out in item["outputs"])
    groups = []
    for i, prompt in enumerate(prompts.input_ids):
        group = []
        for k, out in enumerate(grouped.get(i, [])):
            ids = list(out.response_ids)
            traj = Trajectory(
                i * n + k,
                list(prompt),
                prompts.labels[i],
                max(1, len(ids)),
                tokens=ids,
                logprobs=list(out.logprobs),
                loss_mask=list(out.loss_mask or [1] * len(ids)),
                versions=list(out.versions or [version] * len(ids)),
            )
            traj.end_with(out.finish_reason)
            group.append(traj)
        groups.append(group)
    clock = Clock()
    clock.timing.update(item.get("timing", {}))
    return Produced(int(item["iteration"]), version, groups, {}, clock)
