"""The interface every device kind implements."""
from __future__ import annotations

import os
from typing import Dict

import torch


class Accelerator:
    """One device kind: torch device, distributed backend, Ray resource, memory."""

    kind: str = ""
    dist_backend: str = ""
    ray_resource: str = ""

    def device_count(self) -> int:
        raise NotImplementedError

    def device(self, local_rank: int = 0) -> torch.device:
        raise NotImplementedError

    def set_device(self, local_rank: int = 0) -> torch.device:
        return self.device(local_rank)

    def current_device(self) -> torch.device:
        return self.device(int(os.environ.get("LOCAL_RANK", "0")))

    def synchronize(self) -> None:
        raise NotImplementedError

    def empty_cache(self) -> None:
        raise NotImplementedError

    def memory_stats(self) -> Dict[str, float]:
        """Memory in GiB: allocated, reserved, max_allocated (device), and host rss."""
        raise NotImplementedError

    def prepare_vllm(self) -> None:
        """Device-specific adjustments to vLLM before an in-process engine starts (none by default)."""

    def release_vllm(self) -> None:
        """Device-specific clean-up after an in-process engine stopped (none by default)."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def ray_bundle(self, fraction: float = 1.0) -> Dict[str, float]:
        """Resources of one device slot in a Ray placement-group bundle or actor request."""
        return {self.ray_resource: fraction}

    def describe(self) -> str:
        return f"{self.kind} ({self.device_count()} device(s), backend {self.dist_backend})"


def host_rss_gib() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**30
    except ImportError:  # pragma: no cover - psutil ships with ray
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
