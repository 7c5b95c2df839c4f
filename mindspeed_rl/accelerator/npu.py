"""Ascend NPUs: torch_npu, hccl, Ray resource "NPU", MindSpeed's megatron adaptor."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any, Dict, List, Optional

import torch

from ..config_cls.run_config import HostPrecision
from .base import Accelerator, host_rss_gib

log = logging.getLogger(__name__)


class NpuAccelerator(Accelerator):
    kind = "npu"
    dist_backend = "hccl"
    ray_resource = "NPU"
    runs_mindspeed = True
    fused_kernels_by = "MindSpeed"
    VLLM_QUANTIZATION_MISSING = (
        "Ascend A2/A3 have no FP8 arithmetic, and vllm-ascend's W8A8 INT8 has a format of its own "
        "(quant_model_description.json) whose in-place reload has not been run on a device: not set up yet"
    )

    def use_mindspeed_switches(self, argv: List[str]) -> None:
        """MindSpeed's adaptor reads its feature flags from the process's arguments when it is imported
        (``prepare_megatron``): they are appended to sys.argv first (written from MindSpeed's documented flags,
        not run on an NPU here)."""
        if argv and argv[0] not in sys.argv:  # one role per worker process: once
            sys.argv += argv

    def transfer_group(self, store, rank: int, size: int, timeout):
        # torch_npu's HCCL process group, built over its own store like gloo's (checked only on NPU hardware)
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL

        options = ProcessGroupHCCL.Options()
        options._timeout = timeout
        return ProcessGroupHCCL(store, rank, size, options)

    def __init__(self) -> None:
        self.torch_npu = importlib.import_module("torch_npu")  # registers torch.npu

    @property
    def _npu(self):
        return torch.npu  # type: ignore[attr-defined]

    def vllm_weight_transfer_backend(self) -> str:
        return "hccl"  # registered by vllm-ascend's plugin (0.22 and later)

    def device_count(self) -> int:
        return self._npu.device_count()

    def host_precision(self) -> HostPrecision:
        return HostPrecision(True, "Ascend NPUs compute in bf16 natively")

    def device(self, local_rank: int = 0) -> torch.device:
        return torch.device("npu", local_rank % max(1, self.device_count()))

    def set_device(self, local_rank: int = 0) -> torch.device:
        dev = self.device(local_rank)
        self._npu.set_device(dev)
        return dev

    def current_device(self) -> torch.device:
        return torch.device("npu", self._npu.current_device())

    def synchronize(self) -> None:
        self._npu.synchronize()

    def empty_cache(self) -> None:
        self._npu.empty_cache()

    def memory_stats(self) -> Dict[str, float]:
        g = 2**30
        return {
            "allocated_gib": self._npu.memory_allocated() / g,
            "reserved_gib": self._npu.memory_reserved() / g,
            "max_allocated_gib": self._npu.max_memory_allocated() / g,
            "host_rss_gib": host_rss_gib(),
        }

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        self._npu.manual_seed_all(seed)

    def device_rng_state(self) -> Optional[torch.Tensor]:
        return self._npu.get_rng_state()

    def set_device_rng_state(self, state: torch.Tensor) -> None:
        self._npu.set_rng_state(state)

    @classmethod
    def vllm_engine_kwargs(cls, gen: Any) -> Dict[str, Any]:
        """The memory budget, and vllm-ascend's static expert placement: a map of cli/eplb_generate_map.py read over
        the engine's expert-parallel devices (generate_config.expert_map_path; trainer/startup/probes.py checks it
        against the model and the EP size first)."""
        kwargs = super().vllm_engine_kwargs(gen)
        if gen.expert_map_path and gen.infer_expert_parallel_size > 1:
            kwargs["additional_config"] = {"expert_map_path": gen.expert_map_path}
        return kwargs

    @classmethod
    def fused_features(cls) -> Dict[str, bool]:
        """MindSpeed's kernels: fused RoPE, gradient-accumulation fusion, its ring attention and its flash attention
        in megatron's core attention."""
        return dict(
            super().fused_features(),
            rope_fusion=True,
            gradient_accumulation_fusion=True,
            ring_attention=True,
            vendor_attention=True,
        )

    def prepare_megatron(self) -> None:
        """MindSpeed patches megatron-core for NPU (fused kernels, hccl) when installed."""
        try:
            importlib.import_module("mindspeed.megatron_adaptor")
        except ImportError:
            log.warning("MindSpeed is not installed: megatron-core runs on NPU without its fused kernels")

    profile_sort_key = "self_device_time_total"

    def profiler(self, settings, trace_dir: str):
        """torch_npu's profiler at the configured level and export type; its trace_ready handler writes the trace
        (and parses it with profile_analysis) into ``trace_dir``."""
        import torch_npu

        p = torch_npu.profiler
        level = {"level_none": "Level_none", "level0": "Level0", "level1": "Level1", "level2": "Level2"}
        activities = [p.ProfilerActivity.CPU] * bool(settings.profile_with_cpu) + [p.ProfilerActivity.NPU] * bool(
            settings.profile_with_npu
        )
        return p.profile(
            activities=activities or [p.ProfilerActivity.NPU],
            record_shapes=settings.profile_record_shapes,
            profile_memory=settings.profile_with_memory,
            with_stack=settings.profile_with_module,
            experimental_config=p._ExperimentalConfig(
                profiler_level=getattr(p.ProfilerLevel, level[settings.profile_level]),
                export_type=p.ExportType.Db if settings.profile_export_type == "db" else p.ExportType.Text,
                mstx=settings.mstx,
            ),
            on_trace_ready=p.tensorboard_trace_handler(trace_dir, analyse_flag=settings.profile_analysis),
        )

    def export_trace(self, prof, path: str):
        return None  # written by the profiler's trace_ready handler into its trace folder

    def trace_range(self, name: str):
        """An mstx range (msprof and the NPU profiler's lightweight mode)."""
        import contextlib

        import torch_npu

        @contextlib.contextmanager
        def mstx_range():
            handle = torch_npu.npu.mstx.range_start(name)
            try:
                yield
            finally:
                torch_npu.npu.mstx.range_end(handle)

        return mstx_range()
