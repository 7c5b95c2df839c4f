"""Generation with the megatron-core model itself (no vLLM): the fallback rollout engine.

Each step re-runs the model over the whole (left-padded) sequence, so it is O(length^2): right
for small models, tests and machines without vLLM, not for production rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from ..datasets.padding import left_pad
from ..models.packing import megatron_attention_mask, position_ids_from_mask
from .sampling import sample_next


@dataclass
class GenerationOutput:
    prompt_ids: List[int]
    response_ids: List[int]
    logprobs: List[float]
    finish_reason: str  # "stop" (EOS) or "length"


@torch.no_grad()
def generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_id: Optional[int],
    pad_token_id: int = 0,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: Optional[int] = None,
    batch_size: int = 64,
    ignore_eos: bool = False,
    min_tokens: int = 0,
    caps: Optional[Sequence[int]] = None,
) -> List[GenerationOutput]:
    """Sample responses from a single-rank (TP=PP=1) GPTModel with an LM head, over the model's whole
    (padded) vocabulary: the same action space as vLLM and the actor's log-probs (docs/rollout.md).
    ``ignore_eos``: EOS does not stop a response; ``min_tokens``: EOS is not drawn before that many tokens;
    ``caps``: each prompt's own most new tokens (at most ``max_new_tokens``)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    outputs: List[GenerationOutput] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        limits = [min(max_new_tokens, int(c)) for c in caps[start : start + batch_size]] if caps else None
        ids, mask = left_pad(chunk, pad_token_id)
        done = torch.zeros(len(chunk), dtype=torch.bool)
        responses: List[List[int]] = [[] for _ in chunk]
        logps: List[List[float]] = [[] for _ in chunk]
        reasons = ["length"] * len(chunk)
        for step in range(max_new_tokens):
            logits = model(ids, position_ids_from_mask(mask), megatron_attention_mask(mask))[:, -1]
            banned = None
            if eos_token_id is not None and step < min_tokens:
                banned = torch.zeros_like(logits, dtype=torch.bool)
                banned[:, eos_token_id] = True
            tokens, token_logps = sample_next(logits, temperature, top_k, top_p, min_p, generator, banned)
            active = ~done
            for i in torch.nonzero(active).flatten().tolist():
                responses[i].append(int(tokens[i]))
                logps[i].append(float(token_logps[i]))
                if eos_token_id is not None and int(tokens[i]) == eos_token_id and not ignore_eos:
                    done[i] = True
                    reasons[i] = "stop"
                elif limits is not None and len(responses[i]) >= limits[i]:
                    done[i] = True
            ids = torch.cat([ids, torch.where(active, tokens, pad_token_id).unsqueeze(1)], dim=1)
            mask = torch.cat([mask, active.long().unsqueeze(1)], dim=1)
            if bool(done.all()):
                break
        outputs.extend(GenerationOutput(list(p), r, lp, why) for p, r, lp, why in zip(chunk, responses, logps, reasons))
    return outputs
