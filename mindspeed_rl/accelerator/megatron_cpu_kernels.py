"""CPU stand-ins for the multi-tensor kernels megatron-core's optimizer calls (Apex's ``amp_C``, Transformer
Engine's) where neither is installed. megatron's own local fallbacks scale every gradient for clipping by
allocating the product and copying it back, and take the gradient norm one tensor at a time; these do each in one
foreach call, with the same numbers (applied by the CPU compatibility, ``megatron_cpu_compat.apply``)."""

from __future__ import annotations

import importlib
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


def install() -> None:
    """megatron's optimizer modules call these where they hold megatron's local fallbacks."""
    for name, fallback, replacement in (
        ("multi_tensor_scale_impl", "local_multi_tensor_scale", cpu_multi_tensor_scale),
        ("l2_norm_impl", "local_multi_tensor_l2_norm", cpu_multi_tensor_l2norm),
    ):
        _replace_local_fallback(name, fallback, replacement)
