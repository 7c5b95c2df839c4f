"""Fused kernels (``use_fused_rmsnorm``, ``use_fused_swiglu``, ``use_fused_rotary_pos_emb``): which kernels each
role gets on the device, and the batch plan's line saying so. The device answers with its ``fused_features``:
liger-kernel's Triton kernels (CUDA), else torch.compile's (inductor's C++ loops on the CPU). The kernels and the
module swap are ``models/fused_kernels.py``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from ..accelerator import accelerator_class, get_accelerator
from ..accelerator.detect import DeviceUnavailable, forced_device_kind

# the libraries of kernels swapped into the local spec, first choice first: (fused_features key, name)
SWAPPED_KERNELS = (("liger_kernels", "liger-kernel"), ("compiled_kernels", "torch.compile"))


@dataclass(frozen=True)
class FusedKernels:
    """Which of a model's modules run swapped-in kernels and whose (``by``: liger-kernel or torch.compile), or who
    fuses them otherwise (Transformer Engine's layer spec, MindSpeed's adaptor, or nobody: torch), and why a flag
    is not served (one note each)."""

    rmsnorm: bool = False
    swiglu: bool = False
    rope: bool = False
    notes: Tuple[str, ...] = ()
    by: str = "torch"

    def config_fields(self) -> dict:
        """TransformerConfig fields: the fused SwiGLU is the MLP's activation module (megatron calls it on the
        fused gate-up output when ``use_te_activation_func`` is set), so megatron's compiled one is off; the fused
        RoPE is megatron's ``apply_rope_fusion`` hook (models/fused_kernels.py fills it)."""
        fields = dict(bias_activation_fusion=False, use_te_activation_func=True) if self.swiglu else {}
        return dict(fields, apply_rope_fusion=True) if self.rope else fields

    def summary(self) -> str:
        fused = [name for name, on in (("RMSNorm", self.rmsnorm), ("SwiGLU", self.swiglu), ("RoPE", self.rope)) if on]
        head = f"{self.by}'s {', '.join(fused)}" if fused else f"{self.by}'s"
        return head + (f" ({'; '.join(self.notes)})" if self.notes else "")


def choose(megatron, model, features: dict, kind: str, by: str = "torch") -> FusedKernels:
    """The kernels this role gets on device ``kind`` whose ``fused_features`` are ``features``: liger-kernel's
    where the device has them and the local spec runs, else torch.compile's where the device compiles them (the
    CPU); Transformer Engine's spec fuses its own, and on NPU MindSpeed's adaptor patches the local modules.
    ``by``: who fuses them where neither is swapped in (the kind's ``fused_kernels_by``)."""
    rope, swiglu = megatron.use_fused_rotary_pos_emb, megatron.use_fused_swiglu and model.swiglu
    asked = (
        ("use_fused_rmsnorm", megatron.use_fused_rmsnorm, features["fused_rmsnorm"]),
        ("use_fused_swiglu", swiglu, features["fused_swiglu"]),
        ("use_fused_rotary_pos_emb", rope, features["rope_fusion"]),
    )
    if features["transformer_engine"] and not megatron.lora_r:
        return FusedKernels(by="Transformer Engine")
    library = next((name for key, name in SWAPPED_KERNELS if features.get(key)), None)
    if library is None:
        missing = ", ".join(flag for flag, wanted, has in asked if wanted and not has)
        return FusedKernels(notes=(f"{missing}: no such kernel on {kind}; torch's runs",) if missing else (), by=by)
    notes = []
    rmsnorm = megatron.use_fused_rmsnorm and model.normalization == "RMSNorm"
    if megatron.use_fused_rmsnorm and not rmsnorm:
        notes.append(f"use_fused_rmsnorm: {model.normalization} is not fused")
    # the hook serves the standard attention's RoPE; multi-latent attention scales its own (mscale), and a
    # context-parallel rank holds two chunks of each row
    why_not = "multi-latent attention" if model.multi_latent_attention else ""
    why_not = why_not or ("context parallelism" if megatron.context_parallel_size > 1 else "")
    why_not = why_not or ("" if model.position_embedding_type == "rope" else model.position_embedding_type)
    if rope and why_not:
        notes.append(f"use_fused_rotary_pos_emb: not with {why_not}; torch's runs")
    rope = rope and not why_not and not features["rope_fusion"]  # Transformer Engine's hook where installed
    return FusedKernels(rmsnorm, swiglu, rope, tuple(notes), by=library)


def device_kind() -> str:
    """This process's device kind, or the one MINDSPEED_RL_DEVICE names where that device is not here (a dry run
    of a cluster's config on a laptop): its class answers for its kernels."""
    try:
        return get_accelerator().kind
    except DeviceUnavailable:
        return forced_device_kind() or "cpu"


def plan_lines(cfg: Any) -> List[str]:
    """One line per distinct choice among the roles that ask for a fused kernel, on this process's device."""
    kind = device_kind()
    acc = accelerator_class(kind)
    features = acc.fused_features()
    lines: Dict[str, List[str]] = {}
    for role in cfg.roles:
        m = role.megatron
        if m.use_fused_rmsnorm or m.use_fused_swiglu or m.use_fused_rotary_pos_emb:
            lines.setdefault(choose(m, role.model, features, kind, acc.fused_kernels_by).summary(), []).append(
                role.name
            )
    return [f"  kernels   : {', '.join(names)}: {summary}" for summary, names in lines.items()]
