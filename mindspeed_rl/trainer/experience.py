"""The experience batch: rollout outputs -> padded tensors, DP splits, mini-batches."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from ..datasets.padding import left_pad

Tensors = Dict[str, torch.Tensor]


def build_experience(prompts: Sequence[Sequence[int]], outputs: List[Tuple], n: int, pad_id: int) -> Tensors:
    """Rows ordered prompt by prompt (n responses each): left-padded prompt + right-padded response.

    ``outputs``: (prompt_index, response_ids, logprobs, finish_reason) with global prompt indices.
    """
    by_prompt: Dict[int, List[Tuple]] = {}
    for out in outputs:
        by_prompt.setdefault(out[0], []).append(out)
    rows = []
    for i in range(len(prompts)):
        got = by_prompt.get(i, [])
        if len(got) != n:
            raise RuntimeError(f"prompt {i}: {len(got)} responses, expected {n}")
        rows += [(prompts[i], o[1], o[2]) for o in got]
    prompt_ids, prompt_mask = left_pad([r[0] for r in rows], pad_id)
    width = max(1, max(len(r[1]) for r in rows))
    response_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(rows), width), dtype=torch.long)
    rollout_log_probs = torch.zeros((len(rows), width), dtype=torch.float32)
    for b, (_, resp, logps) in enumerate(rows):
        if resp:
            response_ids[b, :len(resp)] = torch.tensor(resp, dtype=torch.long)
            response_mask[b, :len(resp)] = 1
            rollout_log_probs[b, :len(resp)] = torch.tensor(logps, dtype=torch.float32)
    return {"input_ids": torch.cat([prompt_ids, response_ids], 1),
            "attention_mask": torch.cat([prompt_mask, response_mask], 1),
            "response_mask": response_mask, "prompt_mask": prompt_mask, "response_ids": response_ids,
            "rollout_log_probs": rollout_log_probs, "prompt_width": torch.tensor(prompt_ids.shape[1]),
            "group": torch.arange(len(rows)) // n}


MODEL_INPUTS = ("input_ids", "attention_mask", "response_mask")


def select(batch: Tensors, keys: Sequence[str], rows=None) -> Tensors:
    out = {k: (batch[k] if rows is None else batch[k][rows]) for k in keys if k in batch}
    out["prompt_width"] = batch["prompt_width"].clone()
    return out


def split_rows(num_rows: int, parts: int) -> List[np.ndarray]:
    if num_rows % parts:
        raise ValueError(f"{num_rows} rows do not split over {parts} data-parallel ranks")
    return np.array_split(np.arange(num_rows), parts)


def mini_batch_plan(num_rows: int, mini_batch_size: int, epochs: int, shuffle: bool, seed: int) -> List[np.ndarray]:
    """Row indices of every optimizer step: epochs x (num_rows / mini_batch_size) mini-batches."""
    plan = []
    for epoch in range(epochs):
        order = np.random.RandomState(seed + epoch).permutation(num_rows) if shuffle else np.arange(num_rows)
        plan += [order[i:i + mini_batch_size] for i in range(0, num_rows, mini_batch_size)]
    return plan
