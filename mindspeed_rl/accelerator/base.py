"""The interface every device kind implements."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..config_cls.run_config import HostPrecision


class Accelerator:
    """One device kind: torch device, distributed backend, Ray resource, memory, and every decision
    that depends on the kind (the defaults here are those of a device with its own memory)."""

    kind: str = ""
    fused_kernels_by = "torch"  # who fuses the norm, SwiGLU and RoPE when liger-kernel does not (the plan line)
    dist_backend: str = ""
    ray_resource: str = ""
    pin_memory: bool = True
    """Pin the host copies of offloaded tensors."""
    offload_when_idle: bool = True
    """Move an idle role's weights and optimizer state to host memory (the critic between its steps)."""
    cpu_initialization: bool = False
    """megatron-core's use_cpu_initialization: initialise parameters on the CPU."""
    vllm_supports_sleep: bool = True
    """vLLM's sleep mode frees the engine's memory between rollouts."""
    runs_mindspeed: bool = False
    """MindSpeed's switches (swap_optimizer, reuse_fp32_param, recompute_norm, ...) reach MindSpeed here."""
    fused_adam: bool = False
    """Step megatron-core's torch AdamW (no Transformer Engine or Apex optimizer here) with torch's fused kernel."""
    roles_start_together: bool = False
    """Build the roles' worker groups side by side. Not where vLLM sizes its KV cache from the device memory it
    finds free while it starts: another role loading its weights meanwhile would change that."""

    def device_count(self) -> int:
        raise NotImplementedError

    def sharing_cores(self, ways: int) -> contextlib.AbstractContextManager:
        """Around a call that runs while ``ways - 1`` other roles' calls run on the same devices
        (``rl_config.blocking: false``): a device with its own cores has nothing to split."""
        return contextlib.nullcontext()

    def use_mindspeed_switches(self, argv: List[str]) -> None:
        """Hand a role's MindSpeed flags to MindSpeed before megatron-core is patched (a device without MindSpeed
        refuses them before start: trainer/startup/preflight.py)."""
        if argv:
            raise ValueError(f"MindSpeed's switches {argv} do not run on {self.kind}")

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

    @classmethod
    def import_megatron(cls) -> None:
        """Import megatron-core as this kind runs it (here: as it is)."""
        import importlib

        importlib.import_module("megatron.core")

    def prepare_process(self) -> None:
        """Settings of a worker process on this kind, made before it builds anything (none by default)."""

    def prepare_vllm(self, compiled: bool = False) -> None:
        """Device-specific adjustments to vLLM before an in-process engine starts (none by default); ``compiled``:
        the engine will compile its model (``enforce_eager`` false)."""

    def release_vllm(self) -> None:
        """Device-specific clean-up after an in-process engine stopped (none by default)."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def device_rng_state(self) -> Optional[torch.Tensor]:
        """The device generator's state (None where the device has none of its own)."""
        raise NotImplementedError

    def set_device_rng_state(self, state: torch.Tensor) -> None:
        raise NotImplementedError

    def comm_device(self, device: torch.device) -> torch.device:
        """Where tensors for collectives live, given the engine's ``device``."""
        return device

    def transfer_group(self, store: Any, rank: int, size: int, timeout: Any) -> Any:
        """A process group of its own over ``store`` (outside the default world): the weight channel between
        the actor and rollout workers. Gloo here; device accelerators use their collective library."""
        import torch.distributed as dist

        return dist.ProcessGroupGloo(store, rank, size, timeout)

    def vllm_weight_transfer_backend(self) -> str:
        """The engine of vLLM's native weight-transfer API that carries weights to rollout workers on this kind
        (``generate_config.weight_transfer: vllm_native``): the collective library's."""
        raise NotImplementedError

    def place_model(self, module: torch.nn.Module) -> torch.nn.Module:
        """A freshly built megatron-core model on this process's device."""
        return module.to(self.current_device())

    @classmethod
    def fused_features(cls) -> Dict[str, bool]:
        """Which of megatron-core's fused and device-only paths this kind can run (models/builder.py maps
        the config's flags onto them). A classmethod: it needs no device."""
        return {
            "transformer_engine": False,
            "rope_fusion": False,
            "gradient_accumulation_fusion": False,
            "sequence_parallel": True,
            "masked_softmax_fusion": False,
            "flash_attn": True,
            "fused_rmsnorm": True,
            "fused_swiglu": True,
            "bias_activation_fusion": True,
            "bias_dropout_fusion": True,
            "ring_attention": False,  # context_parallel_algo megatron_cp_algo
            "liger_kernels": False,  # liger-kernel's RMSNorm, SwiGLU, RoPE for the local spec (models/fused_kernels.py)
            # the same three compiled by torch.compile where no library has them (models/fused_kernels.py)
            "compiled_kernels": False,
            # a vendor library patches megatron's padded core attention (its flash attention): the local spec keeps
            # megatron's forward there, where elsewhere it attends each query group at once (models/attention.py)
            "vendor_attention": False,
        }

    @classmethod
    def vllm_unusable_reason(
        cls,
        head_dim: int,
        latent: bool = False,
        linear_head_dims: Optional[Tuple[int, int]] = None,
        dtype=None,
        native_bf16: Optional[bool] = None,
    ) -> Optional[str]:
        """Why vLLM's attention on this kind cannot run heads of ``head_dim`` (``latent``: multi-latent attention's
        latent + RoPE head; ``linear_head_dims``: Gated DeltaNet's key and value heads, in an engine of ``dtype``;
        ``native_bf16``: answer for a device with or without native bf16, None: this one); None when it can."""
        return None

    @classmethod
    def vllm_expert_parallel_unavailable(cls) -> str:
        """Why vLLM on this kind cannot split a MoE model's experts over an engine's ranks ("" when it can)."""
        return ""

    # generate_config.rollout_quantization -> vLLM's quantization method on this kind (none: not here):
    # "compressed-tensors" means weights quantized before the transfer (INT8), any other an online method
    VLLM_QUANTIZATION: Dict[str, str] = {}
    VLLM_QUANTIZATION_MISSING = "no online rollout quantization is set up for this device"
    # the precisions whose kernels here also take float32 activations (else bfloat16 / float16 engines only)
    QUANTIZED_FLOAT32: Tuple[str, ...] = ()

    @classmethod
    def vllm_quantization(cls, precision: str, moe: bool = False, dtype: str = "bfloat16") -> str:
        """vLLM's ``quantization`` argument for ``generate_config.rollout_quantization`` on this kind (``moe``: the
        model has routed experts; ``dtype``: the engine's); ValueError with the reason where it has none (or the
        installed vLLM lacks it)."""
        method = cls.VLLM_QUANTIZATION.get(precision)
        if method is None:
            raise ValueError(f"rollout_quantization {precision}: {cls.VLLM_QUANTIZATION_MISSING}")
        if dtype == "float32" and precision not in cls.QUANTIZED_FLOAT32:
            raise ValueError(
                f"rollout_quantization {precision}: vLLM's {precision} kernels on {cls.kind} write bfloat16 or "
                "float16: set generate_config.dtype bfloat16"
            )
        from ..compat.vllm import online_quantization_unavailable

        missing = online_quantization_unavailable(method)
        if missing:
            raise ValueError(f"rollout_quantization {precision}: {missing}")
        return method

    @classmethod
    def vllm_engine_kwargs(cls, gen: Any) -> Dict[str, Any]:
        """vLLM ``LLM(...)`` arguments for this kind's memory, from a GenerateConfig."""
        return {"gpu_memory_utilization": gen.gpu_memory_utilization, "enable_sleep_mode": True}

    def ray_bundle(self, fraction: float = 1.0) -> Dict[str, float]:
        """Resources of one device slot in a Ray placement-group bundle or actor request."""
        return {self.ray_resource: fraction}

    def bundle_cpus(self, devices: int) -> Tuple[float, int]:
        """(CPUs per placement-group bundle, threads per worker) for ``devices`` bundles: one device plus
        one CPU per bundle, the host's CPUs split between the devices as threads (Ray must be running)."""
        return 1.0, max(1, (os.cpu_count() or 1) // max(1, devices))

    def bundle_spec(self, cpus_per_bundle: float) -> Dict[str, float]:
        """One placement-group bundle: one device slot and ``cpus_per_bundle`` CPUs."""
        return {**self.ray_bundle(1.0), "CPU": cpus_per_bundle}

    def actor_options(self, fraction: float) -> Dict[str, Any]:
        """Ray actor options for a worker that takes ``fraction`` of a bundle's device slot."""
        return {"num_cpus": 0.01, "resources": self.ray_bundle(fraction)}

    def local_rank(self) -> int:
        """The device index of this Ray worker process: Ray's assigned id when Ray leaves the visible
        devices alone (RAY_EXPERIMENTAL_NOSET_*_VISIBLE_DEVICES, as the runtime env sets on NPU), else 0."""
        try:
            import ray

            ids = ray.get_runtime_context().get_accelerator_ids().get(self.ray_resource) or []
        except Exception:  # noqa: BLE001 - not inside Ray
            ids = []
        noset = any(k.startswith("RAY_EXPERIMENTAL_NOSET_") and v not in ("", "0") for k, v in os.environ.items())
        return int(ids[0]) if ids and noset else 0

    def host_precision(self) -> HostPrecision:
        """Whether this device runs bf16 natively, and why in a clause (``megatron_training.bf16: auto``)."""
        raise NotImplementedError(f"{self.kind} does not say whether it runs bf16 natively")

    def bf16_slowdown(self) -> Optional[float]:
        """bf16 matmul time over fp32's here, measured (None where not measured)."""
        return None

    def describe(self) -> str:
        return f"{self.kind} ({self.device_count()} device(s), backend {self.dist_backend})"

    # ----- profiling (profiler_config) --------------------------------------------------------------------
    profile_sort_key = "self_cpu_time_total"
    """The key_averages() column a stage's top operators are ranked by."""

    def profile_activities(self, settings: Any) -> list:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU]

    def profiler(self, settings: Any, trace_dir: str) -> Any:
        """A profiler for one profiled call (a context manager; ``settings``: a role's RoleProfilerConfig)."""
        from torch.profiler import profile

        return profile(
            activities=self.profile_activities(settings),
            record_shapes=settings.profile_record_shapes,
            profile_memory=settings.profile_with_memory,
            with_stack=settings.profile_with_module,
        )

    def export_trace(self, prof: Any, path: str) -> Optional[str]:
        """Write ``prof``'s trace to ``path`` (a Chrome trace); returns the path written."""
        prof.export_chrome_trace(path)
        return path

    def trace_range(self, name: str) -> Any:
        """A named range around one of our phases, seen by whichever profiler records (profiler_config's mstx)."""
        return torch.profiler.record_function(name)


def host_rss_gib() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**30
    except ImportError:  # pragma: no cover - psutil ships with ray
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def cpu_vendor() -> str:
    """The CPU's vendor_id in /proc/cpuinfo (GenuineIntel, AuthenticAMD, ...); "" where there is none."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
        return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("vendor_id")), "")
    return ""
