"""Batch-invariant numerics: a token's outputs do not depend on the other tokens in the call, nor on how far its
sequence runs beyond it, so a sampler that re-runs a growing prefix and the trainer's whole-sequence forward
compute bitwise the same log-probs (``generate_config.batch_invariant``, docs/rollout.md "Zero-difference check").

A GEMM's kernel choice and reduction order depend on its shape, so the same row in a call of another size can
round differently (about 1e-7 in fp32). Under :func:`batch_invariant` every call has a fixed shape:

- a linear layer ``y = x W^T (+ b)`` runs on tiles of exactly ``ROWS`` rows of x (the last one zero-padded),
  each tile one GEMM of the same [ROWS, K] x [K, N] shape, so row i of x gives the same y_i wherever it sits;
- causal attention runs block by block (flash attention's online softmax) over fixed blocks of ``BLOCK`` queries
  and ``BLOCK`` keys anchored at position 0. Query i sees the blocks 0 .. floor(i / BLOCK) in that order, the
  keys after it masked to exp(-inf) = 0, so nothing after position i enters its result:
      m_b = max(m_{b-1}, max_j s_ij),  l_b = l_{b-1} e^{m_{b-1} - m_b} + sum_j e^{s_ij - m_b},
      o_b = o_{b-1} e^{m_{b-1} - m_b} + sum_j e^{s_ij - m_b} v_j,   out_i = o_B / l_B,   s_ij = scale q_i . k_j

Everything else in the models we run (norms, rotary, activations, routing, log-softmax over the vocabulary) is
computed per token already. The mode is for proving a stack, not for speed: the tiles cost Python calls.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

ROWS = 32
BLOCK = 32


def tiled_matmul(x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ weight_t [K, N] in tiles of ``ROWS`` rows, every tile one GEMM of the same shape."""
    shape = (*x.shape[:-1], weight_t.shape[1])
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows == 0:
        return x.new_zeros(shape)
    pad = (-rows) % ROWS
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad, flat.shape[1])])
    return torch.cat([torch.mm(tile, weight_t) for tile in flat.split(ROWS)])[:rows].reshape(shape)


def blocked_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T scale + causal) v for [..., L, d] inputs (keys/values as many heads as queries), block by
    block as in the module docstring."""
    lead, length, dim = q.shape[:-2], q.shape[-2], q.shape[-1]
    q, k, v = (t.reshape(-1, t.shape[-2], t.shape[-1]) for t in (q, k, v))
    pad = (-length) % BLOCK
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    heads, padded = q.shape[0], q.shape[1]
    above = torch.ones(BLOCK, BLOCK, dtype=torch.bool, device=q.device).triu(1)
    out = torch.empty_like(q)
    for start in range(0, padded, BLOCK):
        query = q[:, start : start + BLOCK]
        best = q.new_full((heads, BLOCK, 1), float("-inf"))
        total = q.new_zeros(heads, BLOCK, 1)
        acc = q.new_zeros(heads, BLOCK, dim)
        for key_start in range(0, start + BLOCK, BLOCK):
            scores = torch.bmm(query, k[:, key_start : key_start + BLOCK].transpose(1, 2)) * scale
            if key_start == start:
                scores = scores.masked_fill(above, float("-inf"))
            new_best = torch.maximum(best, scores.amax(dim=-1, keepdim=True))
            weights = (scores - new_best).exp()
            keep = (best - new_best).exp()
            total = total * keep + weights.sum(dim=-1, keepdim=True)
            acc = acc * keep + torch.bmm(weights, v[:, key_start : key_start + BLOCK])
            best = new_best
        out[:, start : start + BLOCK] = acc / total
    return out[:, :length].reshape(*lead, length, dim)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    y = tiled_matmul(x, weight.t())
    return y if bias is None else y + bias


class _BatchInvariantMode(TorchFunctionMode):
    """Routes the matrix products of a forward with a 2-D right operand (a weight) through ``tiled_matmul``
    and causal scaled-dot-product attention through ``blocked_causal_attention``; everything else as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm):
            x, w = args[0], args[1]
            if not kwargs and x.dim() >= 2 and w.dim() == 2:
                return tiled_matmul(x, w)
        elif func in (torch.addmm, torch.Tensor.addmm):
            bias, x, w = args[0], args[1], args[2]
            if not kwargs and x.dim() == 2 and w.dim() == 2:
                return bias + tiled_matmul(x, w)
        elif func is F.linear:
            return _linear(*args, **kwargs)
        elif func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            mask, dropout = kwargs.get("attn_mask"), kwargs.get("dropout_p", 0.0)
            if kwargs.get("is_causal") and mask is None and not dropout and len(args) == 3:
                scale = kwargs.get("scale") or q.shape[-1] ** -0.5
                return blocked_causal_attention(q, k, v, scale)
        return func(*args, **kwargs)


@contextlib.contextmanager
def batch_invariant(enabled: bool = True) -> Iterator[None]:
    """Batch-invariant numerics inside the block (a no-op when not ``enabled``)."""
    if not enabled:
        yield
        return
    with _BatchInvariantMode():
        yield


__all__ = ["BLOCK", "ROWS", "batch_invariant", "blocked_causal_attention", "tiled_matmul"]
