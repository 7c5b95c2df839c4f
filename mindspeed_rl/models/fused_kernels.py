"""Fused RMSNorm, SwiGLU and RoPE kernels for the local (non-Transformer-Engine) layer spec: liger-kernel's Triton
kernels, or torch.compile's where no library has them (inductor's C++ loops on the CPU).

``use_fused_rmsnorm``, ``use_fused_swiglu`` and ``use_fused_rotary_pos_emb`` ask for a fused kernel; the accelerator
says whether the device has one (``fused_features()``: ``liger_kernels`` on CUDA with liger-kernel importable,
``compiled_kernels`` on a CPU with a C++ compiler). Where it does, a built model's norms and gated MLP activations
are swapped, module by module, for the fused ones, and megatron's fused-RoPE hook (Transformer Engine's otherwise)
gets the fused RoPE; elsewhere the torch implementation runs unchanged (the exact fallback). The swap keeps every
parameter object (same names, same attributes, same checkpoint), so it changes the arithmetic only:

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w      one kernel forward, one backward (x and w)
    SwiGLU(y)  = silu(y_gate) * y_up,  y = [y_gate | y_up] = linear_fc1(x)      read from the fused buffer in place
    RoPE(t)_p  = t_p * cos(p theta) + rotate_half(t_p) * sin(p theta),  p the token's position in its row

torch.compile's kernels are these torch formulas compiled into one loop nest forward and one backward, where
eager torch makes a pass over memory per operation (SwiGLU's backward: five, and a concatenation of the two
halves' gradients). Sizes are symbolic (``dynamic=True``: a new sequence length or packed micro-batch compiles
nothing), and the loops take their thread count from ``torch.set_num_threads`` when they run, not when they
were compiled (two workers side by side on one thread each stay on theirs).

Per model, not per process: a role built without the flags keeps torch's modules even where another role in the
same process took the kernels. Which role gets which kernel: ``features/fused_kernels.py``.
"""

from __future__ import annotations

import functools
import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional

import torch
from torch import nn

from ..features.fused_kernels import FusedKernels

log = logging.getLogger(__name__)


class FusedRMSNorm(nn.Module):
    """liger-kernel's RMSNorm holding the parameter of the torch norm it replaces, in its "gemma" casting: input and
    weight in fp32, one cast of the result, which is torch's RMSNorm arithmetic (its "llama" casting would round to
    the input's dtype before the weight)."""

    def __init__(self, norm: nn.RMSNorm):
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps if norm.eps is not None else torch.finfo(norm.weight.dtype).eps
        self.normalized_shape = tuple(norm.normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from liger_kernel.ops import LigerRMSNormFunction

        # not in place: megatron keeps the norm's input for recomputation
        return LigerRMSNormFunction.apply(x, self.weight, self.eps, 0.0, "gemma", False)


class FusedSwiGLU(nn.Module):
    """silu(gate) * up over megatron's fused [..., 2 x ffn] gate-up output, in one Triton kernel that reads both
    halves from the one buffer (no chunked copies) and recomputes silu in the backward."""

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        from liger_kernel.ops import LigerFusedGateUpSiLUMulFunction

        # two dimensions in and out: liger-kernel 0.8.5's backward hands back a [tokens, 2 x ffn] gradient for
        # megatron's [s, b, 2 x ffn] input, which autograd refuses
        out = LigerFusedGateUpSiLUMulFunction.apply(y.reshape(-1, y.shape[-1]), False)
        return out.view(*y.shape[:-1], out.shape[-1])


def _rope(t: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """t [batch, seq, heads, d] (contiguous), angles [batch or 1, seq, rotary dims] -> t rotated in one kernel.

    liger-kernel rotates a query and a key together, in place on contiguous storage: the key is a one-head
    scratch tensor here (megatron rotates q and k in separate calls), and the rotation runs on a copy of t
    (megatron keeps t where a recomputation may read it). Its backward rotates the incoming gradient in place, as
    it does in transformers' attention (the attention's gradient is not shared)."""
    from liger_kernel.ops.rope import LigerRopeFunction

    b, s, _, d = t.shape
    cos, sin = (f(angles).to(t.dtype).expand(b, s, -1).contiguous() for f in (torch.cos, torch.sin))
    scratch = t.new_zeros(b, s, 1, d)
    out, _ = LigerRopeFunction.apply(t.clone().transpose(1, 2), scratch.transpose(1, 2), cos, sin)
    return out.transpose(1, 2)


def rope_bshd(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """megatron's fused-RoPE hook, padded layout: t [s, b, h, d], freqs [s, 1 or b, 1, rotary dims] angles."""
    if interleaved:
        raise ValueError("use_fused_rotary_pos_emb: liger-kernel's RoPE rotates halves, not interleaved pairs")
    return _rope(t.contiguous(), freqs[: t.shape[0], :, 0, :])  # megatron's [s, b] as liger-kernel's [batch, seq]


def packed_positions(cu_seqlens: torch.Tensor, tokens: int) -> torch.Tensor:
    """Each packed token's position in its row (rows starting at ``cu_seqlens[:-1]``; tokens after the last row:
    position 0)."""
    bounds = cu_seqlens.to(torch.long)
    tail = tokens - int(bounds[-1])
    starts = torch.cat([bounds[:-1].repeat_interleave(torch.diff(bounds)), bounds.new_full((tail,), -1)])
    positions = torch.arange(tokens, device=cu_seqlens.device)
    return torch.where(starts >= 0, positions - starts.clamp(min=0), 0)


def rope_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1, cp_rank: int = 0):
    """megatron's fused-RoPE hook, packed layout: t [tokens, h, d], rows starting at ``cu_seqlens[:-1]``; each
    token's angle is its position in its row (tokens after the last row: position 0)."""
    if cp_size != 1:
        raise ValueError("use_fused_rotary_pos_emb: liger-kernel's packed RoPE runs without context parallelism")
    positions = packed_positions(cu_seqlens, t.shape[0])
    return _rope(t.contiguous().unsqueeze(0), freqs[positions, 0, 0, :].unsqueeze(0))[0]


_STANCE_LOCK = threading.Lock()
# the threads inside a kernel call, and the stance change the first of them made (undone by the last)
_STANCE: Dict[str, Any] = {"threads": 0, "change": None}


@contextmanager
def torch_compile_on() -> Iterator[None]:
    """torch.compile on for the calls inside, whatever the process set (``allow_torch_compile``). The stance is the
    process's: threads inside at once share one change, undone when the last one leaves."""
    with _STANCE_LOCK:
        if not _STANCE["threads"]:
            _STANCE["change"] = torch.compiler.set_stance("default")
        _STANCE["threads"] += 1
    try:
        # the dynamo flags are this thread's; each kernel's graphs (train and no-grad, fp32 and bf16, one per
        # head count or norm width) stay compiled well past the default limit of 8
        with torch._dynamo.config.patch(disable=False, recompile_limit=64):
            yield
    finally:
        with _STANCE_LOCK:
            _STANCE["threads"] -= 1
            if not _STANCE["threads"]:
                _STANCE["change"].__exit__(None, None, None)


def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by torch.compile on its first call: symbolic sizes, the C++ loops' threads as set when they
    run. A CPU process with an eager vLLM engine keeps torch.compile off (``allow_torch_compile``): each call
    turns it on for itself. Where the compilation fails, ``fn`` runs as written from then on (one warning).
    Inside a region being compiled, ``fn`` is traced as written."""
    state: Dict[str, Any] = {}

    @functools.wraps(fn)
    def run(*args):
        if torch.compiler.is_compiling() or state.get("failed"):
            return fn(*args)
        if "kernel" not in state:
            state["kernel"] = torch.compile(fn, dynamic=True, options={"cpp.dynamic_threads": True})
        try:
            with torch_compile_on():
                return state["kernel"](*args)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            state["failed"] = True
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log.warning("torch.compile could not build %s (%s): torch's version runs", fn.__name__, why)
            return fn(*args)

    return run


@compiled
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: Optional[float]) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * w over the last dimension: torch's nn.RMSNorm."""
    return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)


@compiled
def swiglu(y: torch.Tensor, offset: float, clamp: Optional[float]) -> torch.Tensor:
    """silu(y_gate) * (y_up + offset), y = [y_gate | y_up], each half clamped first where ``clamp`` is set:
    megatron's gated linear unit."""
    gate, up = torch.chunk(y, 2, dim=-1)
    if clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(min=-clamp, max=clamp)
    return torch.nn.functional.silu(gate) * (up + offset)


@compiled
def rotate(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """t * cos(f) + rotate_half(t) * sin(f) on the first ``rotary dims`` of t's last dimension, the rest as it is
    (t [..., d], angles f [..., rotary dims], broadcast): megatron's unfused RoPE, halves rotated."""
    rotary = freqs.shape[-1]
    x, rest = t[..., :rotary], t[..., rotary:]
    first, second = torch.chunk(x, 2, dim=-1)
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    return torch.cat((x * cos + torch.cat((-second, first), dim=-1) * sin, rest), dim=-1)


def compiled_rope_bshd(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """megatron's fused-RoPE hook, padded layout, compiled: t [s, b, h, d], freqs [s, 1 or b, 1, rotary dims]."""
    if interleaved:
        raise ValueError("use_fused_rotary_pos_emb: torch.compile's RoPE rotates halves, not interleaved pairs")
    return rotate(t, freqs[: t.shape[0]])


def compiled_rope_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1, cp_rank=0):
    """megatron's fused-RoPE hook, packed layout, compiled: t [tokens, h, d], each token at its position in its
    row."""
    if cp_size != 1:
        raise ValueError("use_fused_rotary_pos_emb: the packed RoPE runs without context parallelism")
    return rotate(t, freqs[packed_positions(cu_seqlens, t.shape[0]), 0])  # angles [tokens, 1, rotary dims]


class CompiledRMSNorm(nn.Module):
    """torch.compile's RMSNorm holding the parameter of the torch norm it replaces."""

    def __init__(self, norm: nn.RMSNorm):
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps
        self.normalized_shape = tuple(norm.normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class CompiledSwiGLU(nn.Module):
    """torch.compile's gated linear unit over megatron's fused [..., 2 x ffn] gate-up output, with the MLP's
    linear offset and clamp."""

    def __init__(self, config):
        from ..compat.megatron_core import glu_options

        super().__init__()
        self.offset, self.clamp = glu_options(config)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return swiglu(y, self.offset, self.clamp)


# each library's kernels: (norm module from a torch RMSNorm, gated activation from the MLP's config, padded RoPE
# hook, packed RoPE hook)
LIBRARIES = {
    "liger-kernel": (FusedRMSNorm, lambda config: FusedSwiGLU(), rope_bshd, rope_thd),
    "torch.compile": (CompiledRMSNorm, CompiledSwiGLU, compiled_rope_bshd, compiled_rope_thd),
}


def install_rope(by: str) -> None:
    """Fill megatron's fused-RoPE hook with ``by``'s kernel (liger-kernel's or torch.compile's) where Transformer
    Engine has not; only models whose TransformerConfig sets ``apply_rope_fusion`` call it."""
    from megatron.core.models.common.embeddings import rope_utils

    _, _, bshd, thd = LIBRARIES[by]
    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = bshd
    if rope_utils.fused_apply_rotary_pos_emb_thd is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = thd


def swap_modules(gpt: nn.Module, kernels: FusedKernels) -> None:
    """Swap ``gpt``'s torch RMSNorms and gated MLP activations for the fused ones of ``kernels.by``."""
    from megatron.core.transformer.mlp import MLP

    if not (kernels.rmsnorm or kernels.swiglu):
        return
    norm, activation, _, _ = LIBRARIES[kernels.by]
    for parent_name, parent in list(gpt.named_modules()):
        for name, child in list(parent.named_children()):
            if kernels.rmsnorm and type(child) is nn.RMSNorm and child.weight is not None:
                setattr(parent, name, norm(child))
        if kernels.swiglu and isinstance(parent, MLP):
            if not parent.config.gated_linear_unit:
                raise ValueError(f"fused SwiGLU: {parent_name} is not a gated MLP")
            parent.activation_func = activation(parent.config)


__all__ = [
    "CompiledRMSNorm",
    "CompiledSwiGLU",
    "FusedRMSNorm",
    "FusedSwiGLU",
    "install_rope",
    "swap_modules",
]
