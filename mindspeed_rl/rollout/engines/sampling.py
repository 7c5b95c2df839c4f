"""Token sampling from next-token logits: temperature, top-k, top-p, min-p; greedy at temperature 0."""

from __future__ import annotations

from typing import Optional, Tuple

import torch


def filter_logits(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """Set to -inf every token outside the top-k / nucleus / min-p sets. logits: [batch, vocab]."""
    out = logits.clone()
    if top_k > 0 and top_k < out.shape[-1]:
        kth = out.topk(top_k, dim=-1).values[..., -1:]
        out[out < kth] = float("-inf")
    if min_p > 0:
        probs = out.softmax(-1)
        out[probs < min_p * probs.max(dim=-1, keepdim=True).values] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = out.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest set reaching top_p
        sorted_logits[drop] = float("-inf")
        out = torch.full_like(out, float("-inf")).scatter(-1, order, sorted_logits)
    return out


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    generator: Optional[torch.Generator] = None,
    banned: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(next tokens, their log-probs under softmax(logits / temperature)); greedy when temperature is 0.

    The log-prob is the one the actor recomputes for PPO (temperature applied, no top-k/p renormalisation),
    by the actor's own formula (``models.heads.log_probs_and_entropy``), operation for operation.
    ``banned`` ([B, V] bool) marks tokens that may not be drawn (EOS before min_tokens); it changes the draw,
    not the reported log-prob.
    """
    from ...models.heads import log_probs_and_entropy

    logits = logits.float()
    allowed = logits if banned is None else logits.masked_fill(banned, float("-inf"))
    if temperature == 0:
        tokens = allowed.argmax(dim=-1)
    else:
        probs = filter_logits(allowed / temperature, top_k, top_p, min_p).softmax(-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    log_p, _ = log_probs_and_entropy(logits, tokens, temperature or 1.0, with_entropy=False, vocab_parallel=False)
    return tokens, log_p
