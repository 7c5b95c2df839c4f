"""One iteration's prompts, and response ids -> text for the verifiers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch


@dataclass
class PromptBatch:
    """Token ids of each prompt and its label (the reference answer the verifiers compare against)."""

    input_ids: List[List[int]]
    labels: List[str]
    max_new_tokens: Optional[List[int]] = None  # per-prompt response budgets (dataset key max_new_tokens)
    tools: Optional[List[Optional[List[str]]]] = None  # per-prompt tool names (dataset key tools); None: all

    @staticmethod
    def of(dataset, indices) -> "PromptBatch":
        """The prompts (labels, and budgets when the dataset has a max_new_tokens key) of rows ``indices``
        of a PromptDataset."""
        items = [dataset[i] for i in indices]
        budgets = [int(it["max_new_tokens"]) for it in items] if items and "max_new_tokens" in items[0] else None
        tools = [json.loads(it["tools"]) for it in items] if items and "tools" in items[0] else None
        return PromptBatch(
            [list(it["input_ids"]) for it in items], [it.get("labels", "") for it in items], budgets, tools
        )


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


def decode_known(tokenizer, ids: List[int]) -> Tuple[str, int]:
    """Text of ``ids`` without the ids at or above the tokenizer's length, and how many those were."""
    kept = [t for t in ids if t < len(tokenizer)]
    return tokenizer.decode(kept, skip_special_tokens=True), len(ids) - len(kept)
