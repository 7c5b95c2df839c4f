"""Generation with the megatron-core model itself (no vLLM): the fallback rollout engine.

Each step re-runs the model over the whole (left-padded) sequence, so it is O(length^2): right
for small models, tests and machines without vLLM, not for production rollout. ``batch_invariant``: each step
runs the valid tokens packed under ``models.batch_invariant``, so every sampled token's log-prob (and, with
``recorders``, every token's experts) is bitwise what the actor's whole-sequence forward computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from ...datasets.padding import left_pad
from ...models.batch_invariant import batch_invariant as batch_invariant_numerics
from ...models.packing import megatron_attention_mask, pack, position_ids_from_mask
from ...models.router_replay import LayerReplay, moe_layer_numbers, recorded_routes
from .sampling import sample_next


@dataclass
class GenerationOutput:
    prompt_ids: List[int]
    response_ids: List[int]
    logprobs: List[float]
    finish_reason: str  # "stop" (EOS) or "length"
    routes: Optional[torch.Tensor] = None  # [P + R - 1, layers, k] int16, with ``recorders`` (see RolloutOutput)


class _Step:
    """One step's forward: next-token logits [B, V] of every row; packed in batch-invariant numerics (and its
    routes kept) when exact."""

    def __init__(self, model, exact: bool, recorders: Optional[Dict[int, LayerReplay]]):
        self.model, self.exact, self.recorders = model, exact, recorders
        self.routes: Optional[torch.Tensor] = None  # [B, S, layers, k] of the last forward

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not self.exact:
            return self.model(ids, position_ids_from_mask(mask), megatron_attention_mask(mask))[:, -1]
        inp = pack(ids, mask)
        with batch_invariant_numerics():
            out = inp.run(self.model)  # [1, T, V]
        last = inp.cols == ids.shape[1] - 1  # rows still generating end at the last column
        logits = out.new_zeros(ids.shape[0], out.shape[-1])
        logits[inp.rows[last]] = out.reshape(-1, out.shape[-1])[inp.flat[last]]
        if self.recorders:
            self.routes = recorded_routes(self.recorders, inp, len(moe_layer_numbers(self.model.config)))
        return logits


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
    batch_invariant: bool = False,
    recorders: Optional[Dict[int, LayerReplay]] = None,
) -> List[GenerationOutput]:
    """Sample responses from a single-rank (TP=PP=1) GPTModel with an LM head, over the model's whole
    (padded) vocabulary: the same action space as vLLM and the actor's log-probs (docs/rollout.md).
    ``ignore_eos``: EOS does not stop a response; ``min_tokens``: EOS is not drawn before that many tokens;
    ``caps``: each prompt's own most new tokens (at most ``max_new_tokens``); ``recorders``: the model's recording
    router stand-ins (``router_replay.install(..., record=True)``, needs ``batch_invariant``), whose routes of
    the last forward each output carries for its first P + R - 1 tokens."""
    if recorders and not batch_invariant:
        raise ValueError("the fallback engine captures routes only with batch-invariant numerics")
    model.eval()
    step_logits = _Step(model, batch_invariant, recorders)
    weight = next(model.parameters(), None)  # the model's device (a parameterless model runs on the CPU)
    device = weight.device if weight is not None else torch.device("cpu")
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    outputs: List[GenerationOutput] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        limits = [min(max_new_tokens, int(c)) for c in caps[start : start + batch_size]] if caps else None
        ids, mask = (t.to(device) for t in left_pad(chunk, pad_token_id))
        done = torch.zeros(len(chunk), dtype=torch.bool)
        responses: List[List[int]] = [[] for _ in chunk]
        logps: List[List[float]] = [[] for _ in chunk]
        reasons = ["length"] * len(chunk)
        for step in range(max_new_tokens):
            logits = step_logits(ids, mask)
            banned = None
            if eos_token_id is not None and step < min_tokens:
                banned = torch.zeros_like(logits, dtype=torch.bool)
                banned[:, eos_token_id] = True
            tokens, token_logps = sample_next(logits, temperature, top_k, top_p, min_p, generator, banned)
            active = ~done
            picked, picked_logps = tokens.tolist(), token_logps.tolist()  # one copy to the host per step
            for i in torch.nonzero(active).flatten().tolist():
                responses[i].append(picked[i])
                logps[i].append(picked_logps[i])
                if eos_token_id is not None and picked[i] == eos_token_id and not ignore_eos:
                    done[i] = True
                    reasons[i] = "stop"
                elif limits is not None and len(responses[i]) >= limits[i]:
                    done[i] = True
            active = active.to(device)
            ids = torch.cat([ids, torch.where(active, tokens, pad_token_id).unsqueeze(1)], dim=1)
            mask = torch.cat([mask, active.long().unsqueeze(1)], dim=1)
            if bool(done.all()):
                break
        kept = [None] * len(chunk)
        grid = step_logits.routes
        if grid is not None:  # each row's real tokens as the last forward saw them (not the last sampled one)
            seen = mask[:, : grid.shape[1]].bool().to(grid.device)
            kept = [grid[i][seen[i]][: len(p) + len(r) - 1] for i, (p, r) in enumerate(zip(chunk, responses))]
        outputs.extend(
            GenerationOutput(list(p), r, lp, why, routes)
            for p, r, lp, why, routes in zip(chunk, responses, logps, reasons, kept)
        )
    return outputs
