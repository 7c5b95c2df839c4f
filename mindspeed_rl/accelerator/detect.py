"""Which device kind this process runs on: npu > cuda > cpu, or MINDSPEED_RL_DEVICE."""

from __future__ import annotations

import importlib
import os

from ..config_cls.base import ConfigError

KINDS = ("npu", "cuda", "cpu")
ENV_VAR = "MINDSPEED_RL_DEVICE"


class DeviceUnavailable(ConfigError):
    """The device kind asked for (MINDSPEED_RL_DEVICE) is unknown or not usable in this process: a user error
    (one line naming the variable, exit 2 in every entry point)."""

    def __init__(self, message: str):
        super().__init__(ENV_VAR, message)


def forced_device_kind() -> str:
    """The kind MINDSPEED_RL_DEVICE asks for ('' when unset), refused when it names no kind: cheap, no import."""
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced and forced not in KINDS:
        raise DeviceUnavailable(f"{forced!r} is not a device kind: one of {', '.join(KINDS)}")
    return forced


def npu_available() -> bool:
    """torch_npu importable and at least one NPU visible."""
    try:
        torch_npu = importlib.import_module("torch_npu")
    except Exception:  # noqa: BLE001 - any import failure means no usable NPU
        return False
    try:
        return bool(torch_npu.npu.is_available()) and torch_npu.npu.device_count() > 0
    except Exception:  # noqa: BLE001
        return False


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0


def detect_device_kind() -> str:
    """The device kind: MINDSPEED_RL_DEVICE if set (and usable), else the best one present."""
    forced = forced_device_kind()
    if forced:
        if forced == "npu" and not npu_available():
            raise DeviceUnavailable("npu, but torch_npu is not importable or no NPU is visible in this process")
        if forced == "cuda" and not cuda_available():
            raise DeviceUnavailable("cuda, but torch.cuda.is_available() is false in this process")
        return forced
    if npu_available():
        return "npu"
    if cuda_available():
        return "cuda"
    return "cpu"
