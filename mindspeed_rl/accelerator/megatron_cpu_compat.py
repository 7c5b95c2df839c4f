"""Make megatron-core run on a CPU-only torch (applied by the CPU accelerator only).

megatron-core assumes CUDA in a few places (measured with megatron-core 0.12 and 0.16 on CPU):
- ``torch.cuda.current_device()`` as the device of new tensors (RoPE, buffers, p2p) and
  ``torch.cuda.synchronize()``: on a CPU-only torch the first now names the CPU, the
  second does nothing.
- the CUDA RNG tracker (``model-parallel-rng``): replaced by one over the CPU generator.
- ``get_default_causal_mask`` allocating on "cuda": rebuilt on the CPU; RoPE's context-parallel slice
  (``get_pos_emb_on_this_cp_rank``, a pinned CUDA index) likewise.
- optimizer wrappers, grad clipping, the pipeline schedules and ``broadcast_data`` build
  tensors with ``device='cuda'``, call ``.cuda()`` or test ``.type() == 'torch.cuda.FloatTensor'``:
  they run inside :class:`CudaToCpuMode`, a torch-function mode that maps CUDA to the CPU,
  scoped to those calls only. Inside the schedules the model's own operations (their per-micro-batch
  ``forward_step`` and ``backward_step``) run with the mode set aside: under it every tensor operation pays a
  Python dispatch (5 % of the test suite's CPU time).
- ``jit_fuser`` (``torch.compile`` on its fused element-wise functions, fixed when megatron-core is imported):
  megatron-core is imported with ``torch.compile`` as the identity (``import_without_compiled_fusers``).
- megatron's local stand-ins for Apex's multi-tensor kernels (gradient clipping), and on AMD its linear layers'
  fp32 products: ours, ``megatron_cpu_kernels``.
Everything is idempotent and refuses to run when CUDA is actually available.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

try:  # torch's own helpers for its mode stack (private; present in 2.10-2.13): without them the mode stays on
    from torch.overrides import _get_current_function_mode as _current_function_mode
    from torch.overrides import _pop_mode_temporarily
except ImportError:  # pragma: no cover - a torch without them
    _current_function_mode = None  # type: ignore[assignment]

from ..compat.megatron_core import reset_rng_tracker
from . import megatron_cpu_kernels
from .base import cpu_vendor

log = logging.getLogger(__name__)
_APPLIED = False
CPU = torch.device("cpu")


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class CudaToCpuMode(TorchFunctionMode):
    """Within this mode, requests for CUDA tensors produce CPU tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = CPU
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], CPU) + tuple(args[2:])
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        return func(*args, **kwargs)


def on_cpu(fn: Callable) -> Callable:
    """Run ``fn`` inside :class:`CudaToCpuMode`."""
    if getattr(fn, "_mindspeed_rl_on_cpu", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with CudaToCpuMode():
            return fn(*args, **kwargs)

    wrapper._mindspeed_rl_on_cpu = True  # type: ignore[attr-defined]
    return wrapper


def off_cpu_mode(fn: Callable) -> Callable:
    """Run ``fn`` with :class:`CudaToCpuMode` set aside where it is the innermost mode."""
    if _current_function_mode is None:
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if isinstance(_current_function_mode(), CudaToCpuMode):
            with _pop_mode_temporarily():
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper


def _wrap(module_name: str, attr: str, wrapper: Callable[[Callable], Callable] = on_cpu) -> None:
    """Wrap ``module.attr`` (a function, or ``Class.method``) with ``wrapper`` (:func:`on_cpu`)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    owner, _, name = attr.rpartition(".")
    target = getattr(module, owner) if owner else module
    if not hasattr(target, name):
        log.debug("megatron cpu compat: %s.%s not found", module_name, attr)
        return
    setattr(target, name, wrapper(getattr(target, name)))


class CpuRNGStatesTracker:
    """megatron's named RNG states, kept as states of the CPU generator."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.reset()

    def is_initialized(self) -> bool:
        return self._is_initialized

    def reset(self) -> None:
        self._is_initialized = False
        self.states_: dict = {}
        self.seeds_: set = set()
        self._current_state_name = "default-rng"

    def get_states(self) -> dict:
        return {k: v.clone() for k, v in self.states_.items()}

    def set_states(self, states: dict) -> None:
        self._is_initialized = True
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise RuntimeError(f"seed {seed} already exists")
        if name in self.states_:
            raise RuntimeError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        gen = torch.Generator()
        gen.manual_seed(seed)
        self.states_[name] = gen.get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise RuntimeError(f"rng state {name} is not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        previous, self._current_state_name = self._current_state_name, name
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)
            self._current_state_name = previous


def _cpu_causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def _cpu_pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group=None) -> torch.Tensor:
    """megatron's ``get_pos_emb_on_this_cp_rank`` without its pinned-memory CUDA index: chunks r and
    2 CP - 1 - r of the positions (0.12's signature has no ``cp_group``: the global CP group)."""
    from megatron.core import parallel_state as ps

    size = cp_group.size() if cp_group is not None else ps.get_context_parallel_world_size()
    rank = cp_group.rank() if cp_group is not None else ps.get_context_parallel_rank()
    index = torch.tensor([rank, 2 * size - rank - 1], device=pos_emb.device)
    chunks = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * size, -1, *pos_emb.shape[seq_dim + 1 :])
    chunks = chunks.index_select(seq_dim, index)
    return chunks.view(*chunks.shape[:seq_dim], -1, *chunks.shape[seq_dim + 2 :])


# Functions that build CUDA tensors outside the model's forward: run them under the mode.
SCOPED = [
    ("megatron.core.optimizer.clip_grads", "get_grad_norm_fp32"),
    ("megatron.core.optimizer.clip_grads", "clip_grad_by_total_norm_fp32"),
    ("megatron.core.optimizer.clip_grads", "count_zeros_fp32"),
    ("megatron.core.optimizer.optimizer", "MegatronOptimizer.get_grad_norm"),
    ("megatron.core.optimizer.optimizer", "MegatronOptimizer.clip_grad_norm"),
    ("megatron.core.optimizer.optimizer", "MegatronOptimizer.count_zeros"),
    ("megatron.core.optimizer.optimizer", "MixedPrecisionOptimizer.step"),
    ("megatron.core.optimizer.optimizer", "MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan"),
    ("megatron.core.optimizer.optimizer", "Float16OptimizerWithFloat16Params.__init__"),
    ("megatron.core.optimizer.optimizer", "FP32Optimizer.__init__"),
    ("megatron.core.optimizer.optimizer", "FP32Optimizer.step"),
    ("megatron.core.optimizer.optimizer", "ChainedOptimizer.step"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer.__init__"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer.step_with_ready_grads"),
    ("megatron.core.optimizer.grad_scaler", "ConstantGradScaler.__init__"),
    ("megatron.core.optimizer.grad_scaler", "DynamicGradScaler.__init__"),
    ("megatron.core.pipeline_parallel.schedules", "forward_backward_no_pipelining"),
    ("megatron.core.pipeline_parallel.schedules", "forward_backward_pipelining_without_interleaving"),
    ("megatron.core.pipeline_parallel.schedules", "forward_backward_pipelining_with_interleaving"),
    ("megatron.core.tensor_parallel.data", "broadcast_data"),
    ("megatron.core.distributed.distributed_data_parallel", "DistributedDataParallel.__init__"),
    ("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBuffer.__init__"),
    ("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBucketGroup.start_grad_sync"),
    ("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBucketGroup.finish_grad_sync"),
    ("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBucketGroup.start_param_sync"),
    ("megatron.core.distributed.finalize_model_grads", "finalize_model_grads"),
]


# inside the scoped schedules, the model's own operations (module globals the schedules look up at each call)
SET_ASIDE = [
    ("megatron.core.pipeline_parallel.schedules", "forward_step"),
    ("megatron.core.pipeline_parallel.schedules", "backward_step"),
]


def _replace_where_defined(name: str, replacement: Callable, module_names) -> None:
    """``module.name = replacement`` in each of these modules that defines ``name`` (modules that did
    ``from x import name`` hold their own reference); a module the release lacks is skipped."""
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, name):
            setattr(module, name, replacement)


def _uncompiled(model: Any = None, **options: Any) -> Any:
    """``torch.compile``'s signature, compiling nothing: the function itself (or, called with options only, a
    decorator returning it)."""
    return model if model is not None else (lambda fn: fn)


def import_without_compiled_fusers() -> None:
    """Import megatron-core with ``torch.compile`` as the identity, so that its ``jit_fuser`` (the decorator of its
    fused element-wise functions: activations, MoE expert GLUs, the expert-bias update) is the identity for good.
    On CPU those functions then run as written, in every process alike (a process whose dynamo is on would
    compile them with inductor on first use), and the import skips dynamo and inductor: 1.2 s of every worker's
    start (megatron-core 0.16: 2.1 -> 0.9 s). Nothing once megatron-core is imported."""
    import sys

    if "megatron.core" in sys.modules:
        return
    compile_ = torch.compile
    torch.compile = _uncompiled  # type: ignore[assignment]
    try:
        importlib.import_module("megatron.core")
    finally:
        torch.compile = compile_  # type: ignore[assignment]


def apply() -> None:
    """Patch megatron-core (and torch.cuda's device queries) for a CPU-only torch."""
    global _APPLIED
    if _APPLIED:
        return
    if torch.cuda.is_available():
        raise RuntimeError("megatron CPU compatibility must not be applied where CUDA is available")
    import_without_compiled_fusers()
    torch.cuda.current_device = lambda: CPU  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]

    random = importlib.import_module("megatron.core.tensor_parallel.random")
    random.CudaRNGStatesTracker = CpuRNGStatesTracker
    random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    reset_rng_tracker()

    tutils = importlib.import_module("megatron.core.transformer.utils")
    tutils.get_default_causal_mask = _cpu_causal_mask
    _replace_where_defined(
        "get_default_causal_mask",
        _cpu_causal_mask,
        ("megatron.core.transformer.dot_product_attention", "megatron.core.fusions.fused_softmax"),
    )
    _replace_where_defined(
        "get_pos_emb_on_this_cp_rank",
        _cpu_pos_emb_on_this_cp_rank,
        (
            "megatron.core.models.common.embeddings.rope_utils",
            "megatron.core.models.common.embeddings.rotary_pos_embedding",
            "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding",
        ),
    )

    megatron_cpu_kernels.install(cpu_vendor(), torch.backends.cpu.get_cpu_capability())
    for module_name, attr in SCOPED:
        _wrap(module_name, attr)
    for module_name, attr in SET_ASIDE:
        _wrap(module_name, attr, off_cpu_mode)
    _rebind_imported_names()
    _APPLIED = True
    log.info("megatron-core: CPU compatibility applied (gloo, CPU RNG tracker, CUDA->CPU in optimizer/schedules)")


def _rebind_imported_names() -> None:
    """Modules that did ``from x import f`` keep the unwrapped f: point them at the wrapper."""
    pairs = [
        (
            "megatron.core.pipeline_parallel.schedules",
            "megatron.core.pipeline_parallel",
            (
                "forward_backward_no_pipelining",
                "forward_backward_pipelining_without_interleaving",
                "forward_backward_pipelining_with_interleaving",
            ),
        ),
        ("megatron.core.tensor_parallel.data", "megatron.core.tensor_parallel", ("broadcast_data",)),
        (
            "megatron.core.optimizer.clip_grads",
            "megatron.core.optimizer.optimizer",
            ("get_grad_norm_fp32", "clip_grad_by_total_norm_fp32", "count_zeros_fp32"),
        ),
        ("megatron.core.distributed.finalize_model_grads", "megatron.core.distributed", ("finalize_model_grads",)),
    ]
    for src_name, dst_name, names in pairs:
        try:
            src, dst = importlib.import_module(src_name), importlib.import_module(dst_name)
        except ImportError:
            continue
        for name in names:
            if hasattr(src, name) and hasattr(dst, name):
                setattr(dst, name, getattr(src, name))
