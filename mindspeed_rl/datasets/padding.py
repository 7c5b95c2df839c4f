"""Left padding and attention masks for prompt batches: the one place they are built."""

from __future__ import annotations

from typing import Sequence, Tuple

import torch


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, L], attention_mask [B, L]) with each row right-aligned; mask is 1 on real tokens."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if len(seq):
            ids[i, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[i, width - len(seq) :] = 1
    return ids, mask
