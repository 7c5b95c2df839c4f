"""Rows of reasoning-gym's procedural tasks (offline, each with its own scorer): {"question", "answer"}, the answer
being the task's entry as JSON (name, answer, metadata) that the ``reasoning_gym`` verifier hands to the task's
scorer. Written by cli/reasoning_gym_tasks.py for training; generated in place by an evaluation suite."""

from __future__ import annotations

import json
from typing import List, Sequence

SEED_STRIDE = 1_000_003


def unknown_tasks(tasks: Sequence[str]) -> List[str]:
    """The names reasoning-gym does not have."""
    from reasoning_gym.factory import DATASETS

    return [t for t in tasks if t not in DATASETS]


def known_tasks_hint() -> str:
    from reasoning_gym.factory import DATASETS

    return f"{len(DATASETS)} tasks, e.g. {', '.join(sorted(DATASETS)[:5])}"


def rows(tasks: Sequence[str], size: int, seed: int) -> List[dict]:
    """``size`` rows of each task, interleaved: [task0 row0, task1 row0, ..., task0 row1, ...]."""
    import reasoning_gym

    # reasoning-gym draws item i from seed + i: seeds a million apart never share an item (a held-out set)
    made = [reasoning_gym.create_dataset(name, size=size, seed=seed * SEED_STRIDE) for name in tasks]
    out = []
    for i in range(size):
        for name, dataset in zip(tasks, made):
            entry = dataset[i]
            label = {"task": name, "answer": entry["answer"], "metadata": entry["metadata"]}
            out.append({"question": entry["question"], "answer": json.dumps(label, default=str)})
    return out
