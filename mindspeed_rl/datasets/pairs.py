"""Preference pairs as model rows: each pair's two answers after its prompt, side by side in one batch."""

from __future__ import annotations

from typing import Dict, Mapping, Sequence, Tuple

import torch

from .padding import left_pad

PAIR_FIELDS = ("chosen_ids", "rejected_ids")


def pair_rows(items: Sequence[Mapping], pad_id: int = 0) -> Dict[str, torch.Tensor]:
    """Rows 2i and 2i + 1: prompt + chosen and prompt + rejected of pair i, left-padded (as the PPO reward model
    reads its rows: the score is the value at the last real token)."""
    ids, mask = left_pad(
        [list(item["input_ids"]) + list(item[field]) for item in items for field in PAIR_FIELDS], pad_id
    )
    return {"input_ids": ids, "attention_mask": mask}


def dpo_rows(items: Sequence[Mapping], pad_id: int = 0) -> Dict[str, torch.Tensor]:
    """``pair_rows`` with ``answer_mask``: 1 on each row's answer tokens (the last ones: rows are left-padded), the
    tokens whose log-probabilities make log pi(answer | prompt)."""
    rows = pair_rows(items, pad_id)
    lengths = torch.tensor([len(item[field]) for item in items for field in PAIR_FIELDS])
    width = rows["input_ids"].shape[1]
    rows["answer_mask"] = (torch.arange(width)[None, :] >= width - lengths[:, None]).long()
    return rows


def split_pair_scores(scores: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) scores of the pairs of ``pair_rows``."""
    return scores[0::2], scores[1::2]


def pair_length(item: Mapping) -> int:
    """The longest sequence of a pair: its prompt and the longer answer."""
    return len(item["input_ids"]) + max(len(item[field]) for field in PAIR_FIELDS)
