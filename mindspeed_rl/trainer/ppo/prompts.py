"""Response ids -> text for the verifiers."""

from __future__ import annotations

from typing import List, Tuple

import torch

from ...utils.hf_tokenizer import decode_known


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> Tuple[List[str], int]:
    """Texts of the responses and the number of tokens outside the tokenizer.

    The action space of rollout and training is the model's whole (padded) vocabulary; ids at or above
    the tokenizer's length have no text and are left out of it (counted, so a model that samples
    them is visible in the metrics as rollout/out_of_vocab_tokens).
    """
    texts, outside = [], 0
    for ids, mask in zip(response_ids, response_mask):
        text, unknown = decode_known(tokenizer, ids[mask.bool()].tolist())
        texts.append(text)
        outside += unknown
    return texts, outside
