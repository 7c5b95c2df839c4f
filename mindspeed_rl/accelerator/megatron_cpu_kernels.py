"""CPU stand-ins for what megatron-core hands to fused kernels on a GPU (applied by the CPU compatibility,
``megatron_cpu_compat.apply``):

- the multi-tensor kernels its optimizer calls (Apex's ``amp_C``, Transformer Engine's) where neither is
  installed: megatron's own local fallbacks scale every gradient for clipping by allocating the product and
  copying it back, and take the gradient norm one tensor at a time; these do each in one foreach call, with the
  same numbers;
- the operands of a linear layer's weight gradient, grad_output^T @ input: oneDNN's bf16 / fp16 matmul runs
  up to half as fast when its first operand is a transposed view, so a narrow grad_output is laid out
  transposed first (a small copy);
- on AMD CPUs with AVX-512, the fp32 products of its linear layers: torch multiplies fp32 matrices with MKL,
  which runs its AVX2 code on AMD (about 200 GFLOP/s on a 2-core EPYC with AVX-512, where oneDNN's fp32 matmul
  reaches 420-510), so there the forward and the input's gradient go through oneDNN (``OneDnnLinear``). The
  weight's gradient stays MKL's: oneDNN is no faster with its transposed operands. Where the CPU has only AVX2,
  MKL's kernels are the faster (170-175 against 140-160 GFLOP/s on a 2-core AVX2-only EPYC) and stay.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable

import torch


def cpu_multi_tensor_scale(chunk_size: int, noop_flag: Any, tensor_lists: list, scale: float) -> None:
    """amp_C's ``multi_tensor_scale`` on the CPU: dst = src x scale, in place (one pass) where the two lists are
    the same tensors, as in gradient clipping; otherwise megatron's own ``dst.copy_(src * scale)``."""
    sources, targets = tensor_lists
    if not targets:
        return
    if all(s is t for s, t in zip(sources, targets)):
        torch._foreach_mul_(list(targets), scale)
        return
    for s, t in zip(sources, targets):
        t.copy_(s * scale)


def cpu_multi_tensor_l2norm(chunk_size: int, noop_flag: Any, tensor_lists: list, per_tensor: bool, *args: Any):
    """amp_C's ``multi_tensor_l2norm`` on the CPU: the 2-norm of all tensors of the first list together (the norm
    of their norms, as megatron's local fallback computes it) in one foreach call, as a float32 [1] tensor."""
    tensors = list(tensor_lists[0])
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)).float()) if tensors else torch.zeros(())
    return total.reshape(1).to(torch.float32), None


def wgrad_operands(prepare: Callable) -> Callable:
    """megatron's ``prepare_input_tensors_for_wgrad_compute`` (``prepare``: contiguous 2-D grad_output and input)
    with a 16-bit grad_output at most half as wide as the input (an MLP's down projection) stored transposed, so
    that ``grad_output.t()`` in the weight gradient is a contiguous matrix. Wider ones stay: for a square layer
    or an MLP's first one the copy costs about what it saves, or more. float32 stays too: MKL's sgemm takes
    transposed operands at full speed."""

    def prepare_for_cpu_matmul(grad_output: torch.Tensor, inputs: torch.Tensor):
        grad_output, inputs = prepare(grad_output, inputs)
        if grad_output.dtype in (torch.bfloat16, torch.float16) and 2 * grad_output.shape[-1] <= inputs.shape[-1]:
            grad_output = grad_output.t().contiguous().t()
        return grad_output, inputs

    prepare_for_cpu_matmul.megatron_prepare = prepare  # type: ignore[attr-defined]
    return prepare_for_cpu_matmul


def onednn_linear(x2d: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
    """x2d [M, K] @ weight^T ([N, K], a strided view allowed) + bias, by oneDNN's matmul."""
    return torch.ops.mkldnn._linear_pointwise(x2d, weight, bias, "none", [], "")


class OneDnnLinear(torch.autograd.Function):
    """y = x W^T + b and its gradients, as megatron's linear computes them (dx = dy W, dW = dy^T x, db = sum dy),
    the forward and dx by oneDNN, dW by torch's matmul."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        out = onednn_linear(x.reshape(-1, x.shape[-1]), weight, bias)
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        need_x, need_w, need_b = ctx.needs_input_grad
        grad_x = onednn_linear(flat, weight.t(), None).view(x.shape) if need_x else None
        grad_w = flat.t().matmul(x.reshape(-1, x.shape[-1])) if need_w else None
        grad_b = flat.sum(0) if ctx.has_bias and need_b else None
        return grad_x, grad_w, grad_b


def fp32_by_onednn(linear: Callable) -> Callable:
    """megatron's linear function ``linear`` (trained or frozen weight) with its fp32 products on oneDNN where
    nothing else is asked of it: no gradient-accumulation fusion, tensor-parallel all-reduce, sequence parallelism
    or deferred weight gradient, and no torch function mode watching (the batch-invariant mode's tiled products)."""
    signature = inspect.signature(linear)

    @functools.wraps(linear)
    def routed(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        named = call.arguments
        x, weight = named["input"], named["weight"]
        extra = ("gradient_accumulation_fusion", "allreduce_dgrad", "sequence_parallel", "grad_output_buffer")
        if (
            x.device.type == "cpu"
            and x.dtype == weight.dtype == torch.float32
            and not any(named.get(key) for key in extra)
            and not torch.overrides._get_current_function_mode_stack()
        ):
            return OneDnnLinear.apply(x, weight, named.get("bias"))
        return linear(*args, **kwargs)

    routed.megatron_linear = linear  # type: ignore[attr-defined]
    return routed


def fp32_gemm_library(vendor: str, isa: str) -> str:
    """Which library multiplies fp32 matrices in megatron's linear layers on a CPU of ``vendor`` (/proc/cpuinfo's
    vendor_id) whose widest vector ISA is ``isa`` (ATen's, e.g. AVX512, AVX2): oneDNN on AMD CPUs with AVX-512
    (MKL runs its AVX2 code there), else MKL (torch's own; about 84% of the fp32 peak on Intel, and on AMD CPUs
    without AVX-512 10-20% faster than oneDNN at the bench shapes)."""
    wide = vendor == "AuthenticAMD" and isa.upper().startswith("AVX512")
    return "onednn" if wide and torch.backends.mkldnn.is_available() else "mkl"


def _replace_local_fallback(name: str, fallback: str, replacement: Callable) -> None:
    """Point megatron's optimizer modules' ``name`` at ``replacement`` where it is megatron's local ``fallback``
    (Transformer Engine's and Apex's kernels, where installed, stay)."""
    utils = importlib.import_module("megatron.core.utils")
    local = getattr(utils, fallback, None)
    for module_name in ("megatron.core.optimizer.optimizer", "megatron.core.optimizer.clip_grads"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if local is not None and getattr(module, name, None) is local:
            setattr(module, name, replacement)


def install(vendor: str = "", isa: str = "") -> None:
    """megatron's optimizer modules call these where they hold megatron's local fallbacks; its linear layers
    prepare their weight gradient's operands with ``wgrad_operands`` and, on a CPU (``vendor``, ``isa``) whose
    fp32 products are oneDNN's (``fp32_gemm_library``), run them through ``fp32_by_onednn``."""
    for name, fallback, replacement in (
        ("multi_tensor_scale_impl", "local_multi_tensor_scale", cpu_multi_tensor_scale),
        ("l2_norm_impl", "local_multi_tensor_l2_norm", cpu_multi_tensor_l2norm),
    ):
        _replace_local_fallback(name, fallback, replacement)
    layers = importlib.import_module("megatron.core.tensor_parallel.layers")
    prepare = getattr(layers, "prepare_input_tensors_for_wgrad_compute", None)
    if prepare is not None and not hasattr(prepare, "megatron_prepare"):
        layers.prepare_input_tensors_for_wgrad_compute = wgrad_operands(prepare)
    if fp32_gemm_library(vendor, isa) == "onednn":
        for name in ("linear_with_grad_accumulation_and_async_allreduce", "linear_with_frozen_weight"):
            linear = getattr(layers, name, None)
            if linear is not None and not hasattr(linear, "megatron_linear"):
                setattr(layers, name, fp32_by_onednn(linear))
