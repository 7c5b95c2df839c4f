"""Fused RMSNorm and SwiGLU kernels for the local (non-Transformer-Engine) layer spec, from liger-kernel.

``use_fused_rmsnorm`` and ``use_fused_swiglu`` ask for a fused kernel; the accelerator says whether the device has
one (``fused_features()["liger_kernels"]``: CUDA with liger-kernel importable). Where it does, a built model's norms
and gated MLP activations are swapped, module by module, for liger-kernel's Triton kernels; elsewhere the torch
implementation runs unchanged (the exact fallback). The swap keeps every parameter object (same names, same
attributes, same checkpoint), so it changes the arithmetic only:

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w      one kernel forward, one backward (x and w)
    SwiGLU(y)  = silu(y_gate) * y_up,  y = [y_gate | y_up] = linear_fc1(x)      read from the fused buffer in place

Per model, not per process: a role built without the flags keeps torch's modules even where another role in the
same process took the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import nn


@dataclass(frozen=True)
class FusedKernels:
    """Which of a model's modules run fused kernels, and why the others do not (one line each)."""

    rmsnorm: bool = False
    swiglu: bool = False
    notes: Tuple[str, ...] = ()

    def config_fields(self) -> dict:
        """TransformerConfig fields: the fused SwiGLU is the MLP's activation module (megatron calls it on the
        fused gate-up output when ``use_te_activation_func`` is set), so megatron's compiled one is off."""
        return dict(bias_activation_fusion=False, use_te_activation_func=True) if self.swiglu else {}


def choose(megatron, model, features: dict, kind: str) -> FusedKernels:
    """The kernels this role gets on device ``kind`` whose ``fused_features`` are ``features``: liger-kernel's
    where the device has them and the local spec runs (Transformer Engine's spec fuses its own; on NPU MindSpeed's
    adaptor patches the local modules)."""
    asked = (
        ("use_fused_rmsnorm", megatron.use_fused_rmsnorm, features["fused_rmsnorm"]),
        ("use_fused_swiglu", megatron.use_fused_swiglu and model.swiglu, features["fused_swiglu"]),
    )
    te_spec = features["transformer_engine"] and not megatron.lora_r
    if te_spec or not features.get("liger_kernels"):
        return FusedKernels(
            notes=tuple(
                f"{flag}: no such kernel on {kind}; torch's runs" for flag, wanted, has in asked if wanted and not has
            )
        )
    rmsnorm = megatron.use_fused_rmsnorm and model.normalization == "RMSNorm"
    notes = (
        () if rmsnorm or not megatron.use_fused_rmsnorm else (f"use_fused_rmsnorm: {model.normalization} is not fused",)
    )
    return FusedKernels(rmsnorm=rmsnorm, swiglu=bool(asked[1][1]), notes=notes)


class FusedRMSNorm(nn.Module):
    """liger-kernel's RMSNorm holding the parameter of the torch norm it replaces (Llama's casting: the inverse
    RMS in fp32, the product in the input's dtype)."""

    def __init__(self, norm: nn.RMSNorm):
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps if norm.eps is not None else torch.finfo(norm.weight.dtype).eps
        self.normalized_shape = tuple(norm.normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from liger_kernel.ops import LigerRMSNormFunction

        # not in place: megatron keeps the norm's input for recomputation
        return LigerRMSNormFunction.apply(x, self.weight, self.eps, 0.0, "llama", False)


class FusedSwiGLU(nn.Module):
    """silu(gate) * up over megatron's fused [..., 2 x ffn] gate-up output, in one Triton kernel that reads both
    halves from the one buffer (no chunked copies) and recomputes silu in the backward."""

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        from liger_kernel.ops import LigerFusedGateUpSiLUMulFunction

        # two dimensions in and out: liger-kernel 0.8.5's backward hands back a [tokens, 2 x ffn] gradient for
        # megatron's [s, b, 2 x ffn] input, which autograd refuses
        out = LigerFusedGateUpSiLUMulFunction.apply(y.reshape(-1, y.shape[-1]), False)
        return out.view(*y.shape[:-1], out.shape[-1])


def swap_modules(gpt: nn.Module, kernels: FusedKernels) -> List[str]:
    """Swap ``gpt``'s torch RMSNorms and gated MLP activations for the fused ones; returns what was swapped."""
    from megatron.core.transformer.mlp import MLP

    swapped: List[str] = []
    for parent_name, parent in list(gpt.named_modules()):
        for name, child in list(parent.named_children()):
            path = f"{parent_name}.{name}" if parent_name else name
            if kernels.rmsnorm and type(child) is nn.RMSNorm and child.weight is not None:
                setattr(parent, name, FusedRMSNorm(child))
                swapped.append(path)
        if kernels.swiglu and isinstance(parent, MLP):
            if not parent.config.gated_linear_unit:
                raise ValueError(f"fused SwiGLU: {parent_name} is not a gated MLP")
            parent.activation_func = FusedSwiGLU()
            swapped.append(f"{parent_name}.activation_func")
    return swapped


__all__ = ["FusedKernels", "FusedRMSNorm", "FusedSwiGLU", "choose", "swap_modules"]
