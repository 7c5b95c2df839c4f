"""NVIDIA GPUs: nccl, Ray resource "GPU"."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Dict, Optional

import torch

from ..config_cls.run_config import HostPrecision
from .base import Accelerator, host_rss_gib

SOFTMAX_KERNELS = ("scaled_upper_triang_masked_softmax_cuda", "scaled_masked_softmax_cuda")


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


class CudaAccelerator(Accelerator):
    kind = "cuda"
    dist_backend = "nccl"
    ray_resource = "GPU"
    # the same schemes as on CPU: FP8 (Hopper and later) and INT8 W8A8 (vLLM's CUTLASS kernels, Turing and later)
    VLLM_QUANTIZATION = {"fp8": "fp8_per_channel", "int8": "compressed-tensors"}

    def transfer_group(self, store, rank: int, size: int, timeout):
        import torch.distributed as dist

        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)

    def vllm_weight_transfer_backend(self) -> str:
        return "nccl"

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def host_precision(self) -> HostPrecision:
        """bf16 tensor cores from Ampere (compute capability 8.0) on; torch's own answer, emulation not counted."""
        major, minor = torch.cuda.get_device_capability()
        name = f"{torch.cuda.get_device_name()} (compute capability {major}.{minor})"
        try:
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # a torch without the keyword answers for the hardware alone
            native = torch.cuda.is_bf16_supported()
        if native:
            return HostPrecision(True, f"{name} runs bf16 natively")
        return HostPrecision(False, f"{name} has no native bf16 (it needs compute capability 8.0)")

    def device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cuda", local_rank % max(1, self.device_count()))

    def set_device(self, local_rank: int = 0) -> torch.device:
        dev = self.device(local_rank)
        torch.cuda.set_device(dev)
        return dev

    def current_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def memory_stats(self) -> Dict[str, float]:
        g = 2**30
        return {
            "allocated_gib": torch.cuda.memory_allocated() / g,
            "reserved_gib": torch.cuda.memory_reserved() / g,
            "max_allocated_gib": torch.cuda.max_memory_allocated() / g,
            "host_rss_gib": host_rss_gib(),
        }

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def prepare_megatron(self) -> None:
        return None

    def device_rng_state(self) -> Optional[torch.Tensor]:
        return torch.cuda.get_rng_state()

    def set_device_rng_state(self, state: torch.Tensor) -> None:
        torch.cuda.set_rng_state(state)

    @classmethod
    def fused_features(cls) -> Dict[str, bool]:
        """Transformer Engine (when importable) brings fused RoPE and gradient-accumulation fusion; without it,
        liger-kernel (when installed, with Triton) fuses the local spec's RMSNorm, SwiGLU and RoPE."""
        try:
            import transformer_engine  # noqa: F401

            te = True
        except ImportError:
            te = False
        liger = all(importlib.util.find_spec(name) is not None for name in ("liger_kernel", "triton"))
        return dict(
            super().fused_features(),
            liger_kernels=liger,
            fused_rmsnorm=te or liger,
            fused_swiglu=te or liger,
            transformer_engine=te,
            rope_fusion=te,
            gradient_accumulation_fusion=te,
            # megatron-core's fused softmax imports these kernels (built by Apex or Megatron-LM's fused_kernels)
            # at the first attention; without them that import fails, so the unfused softmax runs instead
            masked_softmax_fusion=all(_importable(k) for k in SOFTMAX_KERNELS),
            ring_attention=te,  # Transformer Engine's attention with cp_comm_type p2p
        )

    profile_sort_key = "self_device_time_total"

    def profile_activities(self, settings) -> list:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU] * bool(settings.profile_with_cpu) + [ProfilerActivity.CUDA] * bool(
            settings.profile_with_npu
        ) or [ProfilerActivity.CPU]

    def trace_range(self, name: str):
        """An NVTX range (Nsight Systems) that torch.profiler also records."""
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.nvtx.range(name))
        stack.enter_context(torch.profiler.record_function(name))
        return stack
