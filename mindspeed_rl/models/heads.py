"""Output heads: token log-probs and entropy from vocab-parallel logits; the value head.

Logits stay split across tensor-parallel ranks (each holds V/TP vocabulary rows); only
per-token scalars cross ranks, never the full vocabulary. The actor's LM head does not even hold the
logits of a whole micro-batch: the model hands back its last hidden states (``return_hidden_states``) and
``chunked_log_probs`` projects them onto the vocabulary a chunk of tokens at a time, recomputing each chunk
in the backward, so the head's extra memory is one chunk's [tokens, V/TP] at any length.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn


def _tp_group():
    from megatron.core import parallel_state as ps

    return (
        ps.get_tensor_model_parallel_group(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_tensor_model_parallel_rank(),
    )


def _local_tokens(tokens: torch.Tensor, rank: int, vocab_part: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each token's column in this rank's vocabulary slice ([..., 1], clamped into it) and whether the slice holds
    the token."""
    local = tokens - rank * vocab_part
    inside = (local >= 0) & (local < vocab_part)
    return local.clamp(0, vocab_part - 1).unsqueeze(-1), inside


def _log_softmax_terms(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, with_entropy: bool, vocab_parallel: bool
) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """log p(token), entropy, and what the gradient needs: the shift m, log Z and E_p[z - m]. No autograd:
    the shifted logits are formed in place."""
    group, tp, rank = _tp_group() if vocab_parallel else (None, 1, 0)
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    m = z.max(dim=-1, keepdim=True).values
    if tp > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    shifted = z.sub_(m) if z is not logits else z - m
    exp = shifted.exp()
    sum_exp = exp.sum(dim=-1)
    if tp > 1:
        dist.all_reduce(sum_exp, group=group)
    log_z = sum_exp.log()
    column, inside = _local_tokens(tokens, rank, z.shape[-1])
    target = shifted.gather(-1, column).squeeze(-1) * inside
    if tp > 1:
        dist.all_reduce(target, group=group)
    log_p = target - log_z
    entropy = mean_shifted = None
    if with_entropy:
        weighted = exp.mul_(shifted).sum(dim=-1)
        if tp > 1:
            dist.all_reduce(weighted, group=group)
        mean_shifted = weighted / sum_exp
        entropy = log_z - mean_shifted
    return log_p, entropy, m, log_z, mean_shifted


def log_probs_and_entropy(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    vocab_parallel: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Per-token log p(token) and entropy from vocab-parallel logits (no gradient: forward passes and sampling;
    training goes through ``chunked_log_probs``).

    logits: [..., V/TP] this rank's vocabulary slice (``vocab_parallel`` false: the whole vocabulary, no TP
    group needed), tokens: [...] global token ids.
        z = logits / temperature,  m = max_v z (all ranks),  Z = sum_v exp(z - m)
        log p(t) = (z_t - m) - log Z
        H = log Z - sum_v softmax(z)_v (z_v - m)
    """
    with torch.no_grad():
        log_p, entropy, _, _, _ = _log_softmax_terms(logits, tokens, temperature, with_entropy, vocab_parallel)
    return log_p, entropy


class _LinearLogProbs(torch.autograd.Function):
    """log p(t) and entropy of z = h W^T / temperature for one chunk of tokens, in a forward and a backward of
    few passes over the chunk's [tokens, V/TP] logits, which are recomputed in the backward, never kept. With
    p = softmax(z) and g, g_H the incoming gradients of log p(t) and H:
        d/dz_v [g log p(t) + g_H H] = g (1[v = t] - p_v) - g_H p_v (z_v - E_p[z])
        dL/dh = (dL/dz / temperature) W,   dL/dW = (dL/dz / temperature)^T h
    Each rank's vocabulary slice gives its share of dL/dh; the caller's TP identity sums them."""

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, with_entropy, vocab_parallel):
        logits = torch.nn.functional.linear(hidden, weight)
        log_p, entropy, m, log_z, mean_shifted = _log_softmax_terms(
            logits, tokens, temperature, with_entropy, vocab_parallel
        )
        ctx.save_for_backward(hidden, weight, tokens, m, log_z, *([mean_shifted] if with_entropy else []))
        ctx.temperature, ctx.vocab_parallel = temperature, vocab_parallel
        ctx.set_materialize_grads(False)  # an output the loss does not use costs no pass
        return (log_p, entropy) if with_entropy else (log_p,)

    @staticmethod
    def backward(ctx, grad_log_p, grad_entropy=None):
        hidden, weight, tokens, m, log_z, *mean_shifted = ctx.saved_tensors
        rank = _tp_group()[2] if ctx.vocab_parallel else 0
        z = torch.nn.functional.linear(hidden, weight).float()
        if ctx.temperature != 1.0:
            z.div_(ctx.temperature)
        shifted = z.sub_(m)
        grad = shifted.sub(log_z.unsqueeze(-1)).exp_()  # p
        g = (grad_log_p if grad_log_p is not None else torch.zeros_like(log_z)).float().unsqueeze(-1)
        if grad_entropy is not None:
            coefficient = shifted.sub_(mean_shifted[0].unsqueeze(-1)).mul_(grad_entropy.float().unsqueeze(-1)).add_(g)
            grad.mul_(coefficient).neg_()
        else:
            grad.mul_(g).neg_()
        column, inside = _local_tokens(tokens, rank, grad.shape[-1])
        grad.scatter_add_(-1, column, g * inside.unsqueeze(-1))
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        grad = grad.to(weight.dtype)
        grad_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int = 0,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``log_probs_and_entropy`` of logits = hidden W^T, ``chunk_size`` tokens at a time (0: all at once).

    hidden: [..., h] (already gathered over sequence parallelism), weight: [V/TP, h] this rank's vocabulary
    rows, labels: [...] global token ids. With gradients on, each chunk's logits are recomputed in its backward
    (``_LinearLogProbs``), so at most one chunk's logits exist at a time in either pass:
        log p(t_i) = log_softmax(h_i W^T / temperature)[t_i]   for i in chunk c, c = 1..ceil(n / chunk_size)
    """
    shape = labels.shape
    flat_hidden, flat_labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    n = flat_labels.numel()
    size = chunk_size if 0 < chunk_size < n else max(n, 1)
    chunks = [(flat_hidden[start : start + size], flat_labels[start : start + size]) for start in range(0, n, size)]
    parts = [_LinearLogProbs.apply(h, weight, t, temperature, with_entropy, True) for h, t in chunks]
    log_p = torch.cat([p[0] for p in parts]).view(shape)
    entropy = torch.cat([p[1] for p in parts]).view(shape) if with_entropy else None
    return log_p, entropy


class _SumGradOverTP(torch.autograd.Function):
    """Identity whose backward sums the gradient over TP ranks (each rank's vocabulary slice contributes to
    d loss / d hidden). megatron's ``copy_to_tensor_model_parallel_region`` would all-reduce a contiguous
    copy of a non-contiguous gradient and return the original (GPTModel's [s, b] -> [b, s] transpose makes
    it non-contiguous)."""

    @staticmethod
    def forward(ctx, hidden):
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad):
        group, _, _ = _tp_group()
        grad = grad.contiguous()
        dist.all_reduce(grad, group=group)
        return grad


def return_hidden_states(gpt) -> None:
    """Make a last-stage GPTModel return its final hidden states [b, s, h] instead of logits: its output
    layer keeps its weight (checkpoints are unchanged) but only performs the layer's input communication
    (the all-gather of sequence parallelism, or TP's identity whose backward all-reduces)."""
    if not getattr(gpt, "post_process", False):
        return
    layer = gpt.output_layer
    sequence_parallel, tp = gpt.config.sequence_parallel, gpt.config.tensor_model_parallel_size

    def forward(hidden, weight=None, runtime_gather_output=None):
        from megatron.core.tensor_parallel import mappings

        if sequence_parallel:
            hidden = mappings.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True)
        elif tp > 1:
            hidden = _SumGradOverTP.apply(hidden)
        return hidden, None

    layer.forward = forward


def output_weight(gpt) -> torch.Tensor:
    """The [V/TP, h] weight of a last-stage GPTModel's output layer (the embedding's when they are tied)."""
    if gpt.share_embeddings_and_output_weights:
        return gpt.shared_embedding_or_output_weight()
    return gpt.output_layer.weight


class ValueHead(nn.Module):
    """hidden -> 1, replicated on every TP rank; stands in for GPTModel's output layer.

    Same call convention as megatron's ColumnParallelLinear (returns (output, bias)), so
    GPTModel's forward yields values of shape [batch, seq, 1]. With sequence parallelism the
    hidden states are gathered along the sequence first.
    """

    def __init__(
        self,
        hidden_size: int,
        sequence_parallel: bool = False,
        init_std: float = 0.0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        if init_std > 0:
            nn.init.normal_(self.weight, std=init_std)
        self.sequence_parallel = sequence_parallel
        # megatron DDP / optimizer attributes of a replicated parameter
        self.weight.tensor_model_parallel = False
        self.weight.sequence_parallel = False

    def forward(
        self, hidden: torch.Tensor, weight: Optional[torch.Tensor] = None, runtime_gather_output: Optional[bool] = None
    ) -> Tuple[torch.Tensor, None]:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden, self.weight), None


def attach_value_head(gpt, hidden_size: int, init_std: float = 0.0) -> None:
    """Replace the LM output layer of a last-stage GPTModel with a value head."""
    if not getattr(gpt, "post_process", False):
        return
    dtype = next(gpt.parameters()).dtype
    device = next(gpt.parameters()).device
    head = ValueHead(hidden_size, sequence_parallel=gpt.config.sequence_parallel, init_std=init_std, dtype=dtype).to(
        device
    )
    gpt.output_layer = head
    gpt.share_embeddings_and_output_weights = False


def last_token_values(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The value at the last valid token of each row: the ORM score of the whole sequence.

    values: [batch, seq], attention_mask: [batch, seq] with 1 on real tokens (left or right padded).
        score_b = values[b, max{t : mask[b, t] = 1}]
    """
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (attention_mask.long() * positions).argmax(dim=1)
    return values.gather(1, last.unsqueeze(1)).squeeze(1)
