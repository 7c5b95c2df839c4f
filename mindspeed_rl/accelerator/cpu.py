"""CPU: gloo, one 'device' per CPU slot, megatron-core made to run without CUDA."""
from __future__ import annotations

import gc
from typing import Dict

import torch

from .base import Accelerator, host_rss_gib


class CpuAccelerator(Accelerator):
    kind = "cpu"
    dist_backend = "gloo"
    ray_resource = "CPU"

    def device_count(self) -> int:
        import os

        return os.cpu_count() or 1

    def device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        return None

    def empty_cache(self) -> None:
        gc.collect()

    def memory_stats(self) -> Dict[str, float]:
        rss = host_rss_gib()
        return {"allocated_gib": rss, "reserved_gib": rss, "max_allocated_gib": rss, "host_rss_gib": rss}

    def prepare_megatron(self) -> None:
        from .megatron_cpu_compat import apply

        apply()

    def prepare_vllm(self) -> None:
        """No torch.compile in an in-process vLLM on CPU: its compiled helpers (the sampler's log-prob
        gather, the vocab-parallel embedding mask) cost 3-4 s per process on first use, with infer TP > 1
        while the peer rank spins in the shared-memory all-reduce, and buy nothing at this scale."""
        import torch._dynamo

        torch._dynamo.config.disable = True
