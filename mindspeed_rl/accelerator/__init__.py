"""Device layer: npu | cuda | cpu. The only place with device-specific code.

    from mindspeed_rl.accelerator import get_accelerator
    acc = get_accelerator()          # detected once per process (MINDSPEED_RL_DEVICE overrides)
    acc.kind, acc.dist_backend, acc.ray_resource, acc.device(local_rank), acc.memory_stats()
    acc.prepare_megatron()           # before building megatron-core models
    accelerator_class("npu").fused_features()   # what a kind would answer, without its device

Code outside this package asks the accelerator instead of comparing ``kind`` (tests/test_device_floor.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Type

from .detect import ENV_VAR, KINDS, DeviceUnavailable, detect_device_kind, forced_device_kind

if TYPE_CHECKING:
    from .base import Accelerator

_ACCELERATOR: "Optional[Accelerator]" = None


def __getattr__(name: str) -> Any:
    """``Accelerator`` imported when asked for: the device-kind checks (``forced_device_kind``) need no torch."""
    if name == "Accelerator":
        from .base import Accelerator

        return Accelerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def accelerator_class(kind: str) -> Type[Accelerator]:
    """The Accelerator class of ``kind``; its classmethods answer for the kind without its device."""
    if kind == "npu":
        from .npu import NpuAccelerator

        return NpuAccelerator
    if kind == "cuda":
        from .cuda import CudaAccelerator

        return CudaAccelerator
    if kind == "cpu":
        from .cpu import CpuAccelerator

        return CpuAccelerator
    raise DeviceUnavailable(f"{kind!r} is not a device kind: one of {', '.join(KINDS)}")


def make_accelerator(kind: str) -> Accelerator:
    return accelerator_class(kind)()


def get_accelerator() -> Accelerator:
    global _ACCELERATOR
    if _ACCELERATOR is None:
        _ACCELERATOR = make_accelerator(detect_device_kind())
    return _ACCELERATOR


def import_megatron_core() -> None:
    """megatron-core imported as this process's device kind runs it (CPU: its jit_fuser functions uncompiled); as it
    is where the kind MINDSPEED_RL_DEVICE names is not usable here (its run says so when it starts)."""
    try:
        kind = detect_device_kind()
    except DeviceUnavailable:
        import importlib

        importlib.import_module("megatron.core")
        return
    accelerator_class(kind).import_megatron()


def reset_accelerator() -> None:
    """Forget the detected device (tests)."""
    global _ACCELERATOR
    _ACCELERATOR = None


__all__ = [
    "Accelerator",
    "DeviceUnavailable",
    "ENV_VAR",
    "KINDS",
    "accelerator_class",
    "detect_device_kind",
    "forced_device_kind",
    "get_accelerator",
    "import_megatron_core",
    "make_accelerator",
    "reset_accelerator",
]
