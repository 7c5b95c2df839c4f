"""CPU: gloo, one 'device' per CPU slot, megatron-core made to run without CUDA."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import platform
import shutil
import sysconfig
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..compat import vllm as compat_vllm
from ..compat import vllm_cpu_experts, vllm_cpu_reload
from ..config_cls.run_config import HostPrecision
from .base import Accelerator, host_rss_gib
from .host_memory import keep_freed_host_memory

log = logging.getLogger(__name__)

VLLM_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The head dims of vLLM's CPU attention."""


def allow_torch_compile(compiled: bool) -> None:
    """torch.compile in this process, for an in-process vLLM on CPU. Eager (``compiled`` false), vLLM's compiled
    helpers (the sampler's log-prob gather, the vocab-parallel embedding mask) would cost 3-4 s per process on
    first use, with infer TP > 1 while the peer rank spins in the shared-memory all-reduce, and buy nothing at
    this scale: dynamo is off. Compiled (``generate_config.enforce_eager`` false), vLLM traces its model once and
    inductor compiles it, about 25 s per engine process, then decodes 20-35% faster; megatron's own fusers stay
    uncompiled (``import_without_compiled_fusers``)."""
    import torch._dynamo

    torch._dynamo.config.disable = not compiled  # a user override: it holds in this thread only
    # every thread (a rollout worker generates on one of Ray's)
    torch.compiler.set_stance("default" if compiled else "force_eager")
    if compiled:
        log.info("vLLM compiles its model with inductor (generate_config.enforce_eager false): about 25 s per engine")


def torch_compile_can_build() -> bool:
    """Whether torch.compile can build its C++ kernels here: the compiler inductor calls (``CXX``, else g++) and
    Python's headers (inductor builds each kernel as an extension module), unless TORCH_COMPILE_DISABLE=1."""
    if os.environ.get("TORCH_COMPILE_DISABLE") == "1":
        return False
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which(os.environ.get("CXX") or "g++") is not None and os.path.exists(headers)


class CpuAccelerator(Accelerator):
    """The device is the host: no pinning, no offload, no vLLM sleep, no library kernels (torch.compile's instead)."""

    kind = "cpu"
    dist_backend = "gloo"
    ray_resource = "CPU"
    pin_memory = False
    offload_when_idle = False
    cpu_initialization = True
    vllm_supports_sleep = False
    # torch's CPU AdamW otherwise loops tensor by tensor, an op per term: 12.6M parameters 65.6 -> 11.2 ms a step,
    # the same update up to rounding (docs/performance.md)
    fused_adam = True
    roles_start_together = True  # vLLM's CPU KV cache has a fixed size (kv_cache_memory_bytes)

    def device_count(self) -> int:
        return os.cpu_count() or 1

    @contextlib.contextmanager
    def sharing_cores(self, ways: int):
        """A call beside ``ways - 1`` others takes its share of this worker's threads: oversubscribed, two roles at
        two threads each on two cores run over twice as slow as in turn. (torch._C's setter: vLLM's CPU worker makes
        torch.set_num_threads a no-op in its process.)"""
        threads = torch.get_num_threads()
        torch._C.set_num_threads(max(1, threads // max(1, ways)))
        try:
            yield
        finally:
            torch._C.set_num_threads(threads)

    def prepare_process(self) -> None:
        keep_freed_host_memory()

    def device(self, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        return None

    def host_precision(self) -> HostPrecision:
        """Native bf16 where oneDNN computes bf16 (its answer honours ONEDNN_MAX_CPU_ISA) and, on x86, the CPU has
        the instructions for it (AVX512-BF16 or AMX): oneDNN also takes plain AVX-512, emulating bf16 there."""
        capability, onednn, units = cpu_bf16_facts()
        if onednn and (units or platform.machine().lower() not in ("x86_64", "amd64")):
            with_units = " and ".join(units) or "bf16"
            return HostPrecision(True, f"this CPU runs bf16 natively: {capability} with {with_units}")
        emulated = " (oneDNN emulates bf16 on it)" if onednn else ""
        return HostPrecision(False, f"this CPU has no native bf16: {capability}{emulated}")

    def bf16_slowdown(self) -> Optional[float]:
        return matmul_slowdown(torch.bfloat16)

    def empty_cache(self) -> None:
        gc.collect()

    def memory_stats(self) -> Dict[str, float]:
        rss = host_rss_gib()
        return {"allocated_gib": rss, "reserved_gib": rss, "max_allocated_gib": rss, "host_rss_gib": rss}

    @classmethod
    def import_megatron(cls) -> None:
        from .megatron_cpu_compat import import_without_compiled_fusers

        import_without_compiled_fusers()

    def prepare_megatron(self) -> None:
        from .megatron_cpu_compat import apply

        apply()

    def device_rng_state(self) -> Optional[torch.Tensor]:
        return None

    def set_device_rng_state(self, state: torch.Tensor) -> None:
        return None

    def comm_device(self, device: torch.device) -> torch.device:
        return torch.device("cpu")

    def place_model(self, module: torch.nn.Module) -> torch.nn.Module:
        return module  # megatron-core built it on the CPU (use_cpu_initialization)

    @classmethod
    def fused_features(cls) -> Dict[str, bool]:
        """No library kernels; torch.compile's C++ ones (inductor) where a C++ compiler is installed."""
        return dict(dict.fromkeys(super().fused_features(), False), compiled_kernels=torch_compile_can_build())

    # per-output-channel weights, per-token dynamic activations: FP8 (vLLM 0.32's CPU scaled-mm kernel, quantized
    # online by vLLM) and INT8 (its oneDNN W8A8 kernel, weights quantized by us in the compressed-tensors format)
    VLLM_QUANTIZATION = {"fp8": "fp8_per_channel", "int8": "compressed-tensors"}
    QUANTIZED_FLOAT32 = ("int8",)  # oneDNN's int8 GEMM writes float32 too (measured: a float32 engine runs)

    @classmethod
    def vllm_quantization(cls, precision: str, moe: bool = False, dtype: str = "bfloat16") -> str:
        # vLLM 0.32's FP8 MoE quantizes activations with an op its CPU build does not compile
        if moe and precision == "fp8":
            raise ValueError(
                f"rollout_quantization {precision}: vLLM's CPU build has no FP8 kernel for MoE experts "
                "(_C::dynamic_per_token_scaled_fp8_quant is not compiled for CPU)"
            )
        missing = compat_vllm.cpu_int8_kernel_unavailable() if precision == "int8" else ""
        if missing:
            raise ValueError(f"rollout_quantization {precision}: {missing}")
        return super().vllm_quantization(precision, dtype=dtype)

    @classmethod
    def vllm_expert_parallel_unavailable(cls) -> str:
        return vllm_cpu_experts.cpu_expert_parallel_unavailable()

    @classmethod
    def vllm_unusable_reason(
        cls,
        head_dim: int,
        latent: bool = False,
        linear_head_dims: Optional[Tuple[int, int]] = None,
        dtype=None,
        native_bf16: Optional[bool] = None,
    ) -> Optional[str]:
        missing = compat_vllm.cpu_gated_deltanet_unavailable() if linear_head_dims else ""
        if missing:
            return missing
        if linear_head_dims and set(linear_head_dims) != {128}:  # vLLM 0.32's CPU Gated DeltaNet kernel
            return f"vLLM's CPU Gated DeltaNet takes key and value heads of 128 only; the model has {linear_head_dims}"
        if linear_head_dims and dtype not in (None, "bfloat16"):
            return f"vLLM's CPU Gated DeltaNet runs in bfloat16 only (generate_config.dtype is {dtype})"
        # its chunked kernel packs bf16 for oneDNN's brgemm, which AVX2 lacks (measured with oneDNN capped at AVX2:
        # "BFloat16 Brgemm VNNI format is only supported on X64 when oneDNN ukernel is enabled and `amx` is supported")
        if linear_head_dims and native_bf16 is not True:
            host = cls().host_precision()
            if not (host.native_bf16 if native_bf16 is None else native_bf16):
                return f"vLLM's CPU Gated DeltaNet kernel needs native bf16, and {host.why}"
        if latent:  # MLA: vLLM 0.32's CPU backend, whose decode kernel takes a 512 latent + a 64 RoPE key only
            if compat_vllm.cpu_mla_unavailable():
                return compat_vllm.cpu_mla_unavailable()
            if head_dim != 576:
                return (
                    f"vLLM's CPU MLA takes kv_lora_rank + qk_pos_emb_head_dim = 512 + 64 only; the model has {head_dim}"
                )
            return None
        if head_dim not in VLLM_HEAD_DIMS:
            return f"vLLM's CPU attention supports head_dim {VLLM_HEAD_DIMS}; the model has {head_dim}"
        return None

    @classmethod
    def vllm_engine_kwargs(cls, gen: Any) -> Dict[str, Any]:
        """The KV-cache budget in bytes, and no chunked prefill: when a step splits a prompt's prefill, vLLM
        rewinds that request's seeded generator, which CPU generators cannot do ("CPU Generator does not use
        offset"). Many distinct long prompts in one call (partial rollout's continuations) reach that path."""
        return {
            "kv_cache_memory_bytes": vllm_kv_cache_bytes(gen),
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(gen.max_num_batched_tokens, gen.max_model_len),
        }

    def bundle_cpus(self, devices: int) -> Tuple[float, int]:
        """A bundle is a share of the cluster's CPUs that fits on one node."""
        import ray

        total = ray.cluster_resources().get("CPU", os.cpu_count() or 1)
        per_node = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]), default=total)
        per_bundle = max(0.5, min(total / devices, per_node))
        return per_bundle, max(1, int(per_bundle))

    def bundle_spec(self, cpus_per_bundle: float) -> Dict[str, float]:
        return {"CPU": cpus_per_bundle}

    def actor_options(self, fraction: float) -> Dict[str, Any]:
        return {"num_cpus": fraction}

    def local_rank(self) -> int:
        return 0

    def vllm_weight_transfer_backend(self) -> str:
        """vLLM has no CPU engine: ours, over gloo, registered in its factory."""
        from ..compat.vllm_weight_transfer import register_gloo_engine

        return register_gloo_engine()

    def prepare_vllm(self, compiled: bool = False) -> None:
        """An in-process vLLM on CPU runs eager unless its engine is to be compiled (``compiled``:
        ``enforce_eager`` false), see :func:`allow_torch_compile`."""
        import uuid

        import torch.distributed as dist

        allow_torch_compile(compiled)
        vllm_cpu_reload.repack_cpu_moe_experts_on_weight_update()
        compat_vllm.cpu_moe_activation_without_config()
        vllm_cpu_experts.cpu_moe_experts_follow_the_expert_map()
        vllm_cpu_experts.cpu_communicator_gathers_uneven_batches()
        vllm_cpu_reload.keep_cpu_int8_scales_on_reload()
        compat_vllm.no_cpu_thread_binding()
        compat_vllm.inspect_model_classes_in_process()
        compat_vllm.cpu_kv_cache_from_engine_argument()
        compat_vllm.keep_external_launcher_on_cpu()
        vllm_cpu_reload.keep_cpu_linear_weights()
        vllm_cpu_reload.keep_cpu_mla_up_projection()
        # vLLM names the shared-memory segments of its CPU TP all-reduce after the group's ranks and an
        # identity that is empty for in-process engines: two jobs on one host (or a segment an earlier
        # run left behind) then collide ("create shm in SHMManager failed. errno: 17"). Prefix every
        # name with a token that all ranks of this world share.
        if dist.is_initialized() and dist.get_world_size() > 1:
            token = [uuid.uuid4().hex[:12]]
            dist.broadcast_object_list(token, src=0)
            os.environ[SHM_IDENT] = f"mindspeed_rl_{token[0]}"
            _prefix_shm_group_names()

    def release_vllm(self) -> None:
        """Unlink this engine's shared-memory segments (vLLM leaves them in /dev/shm)."""
        import glob

        ident = os.environ.pop(SHM_IDENT, "")
        if not ident:
            return
        for path in glob.glob(os.path.join("/dev/shm", glob.escape(ident) + "*cpushm*")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # a peer rank removed it first


SHM_IDENT = "MINDSPEED_RL_VLLM_SHM_IDENT"
# (what the plan calls it, torch.cpu's probe of the instructions)
BF16_UNITS = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))


def cpu_bf16_facts() -> Tuple[str, bool, List[str]]:
    """(ATen's vector ISA, e.g. AVX2; whether oneDNN computes bf16; the bf16 instruction sets the CPU has), as
    torch reports them (ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA lower the first two)."""
    units = [name for name, probe in BF16_UNITS if getattr(torch.cpu, probe, lambda: False)()]
    return torch.backends.cpu.get_cpu_capability(), bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), units


def matmul_seconds(dtype: torch.dtype, size: int, repeats: int) -> float:
    """The best of ``repeats`` timings of one size^3 matmul in ``dtype``, after a first call that sets up oneDNN's
    kernel."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return best


def matmul_slowdown(dtype: torch.dtype, size: int = 256) -> float:
    """How many times longer a size^3 matmul takes in ``dtype`` than in fp32 here (well under a second even where
    bf16 is emulated, ~0.7 GFLOP/s)."""
    return matmul_seconds(dtype, size, 3) / matmul_seconds(torch.float32, size, 10)


def vllm_kv_cache_bytes(gen: Any) -> int:
    """The KV-cache budget of one engine process on CPU: gpu_memory_utilization of host memory, shared by
    the engine processes of this host (LOCAL_WORLD_SIZE, set by the launcher), and at most 90% of their share of
    the memory free now: vLLM refuses a budget over what its memory node has available, where a smaller cache only
    holds fewer sequences at once."""
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    total, available = compat_vllm.cpu_node_memory()
    wanted = int(gen.gpu_memory_utilization * total / processes)
    room = int(0.9 * available / processes)
    if wanted > room:
        free = available / 2**30
        log.warning(
            f"gpu_memory_utilization {gen.gpu_memory_utilization}: {wanted / 2**30:.2f} GiB of KV cache per engine, "
            f"but {free:.2f} GiB of host memory is free for {processes} engine(s); taking {room / 2**30:.2f} GiB each"
        )
    return min(wanted, room)


def _prefix_shm_group_names() -> None:
    from vllm.distributed.device_communicators import cpu_communicator

    shm = cpu_communicator._CPUSHMDistributed
    original = getattr(shm.make_group_name, "mindspeed_rl_original", shm.make_group_name)

    def make_group_name(communicator) -> str:
        # the original starts with the port of the init method: "//" for the external launcher's env://
        return os.environ.get(SHM_IDENT, "") + original(communicator).replace("/", "")

    make_group_name.mindspeed_rl_original = original
    shm.make_group_name = staticmethod(make_group_name)
