"""vLLM's native weight-transfer API (``vllm.distributed.weight_transfer``) across releases.

A weight-transfer engine lives in each vLLM worker; the trainer joins it in a group of its own and
broadcasts tensors that the worker loads as they arrive. Its surface churns between releases:

- 0.18 (the NPU set): a single-shot ``Worker.update_weights`` (layer-wise reload inside one call, the whole
  model's names, dtypes and shapes in one request) and no start / finish. Not used here: our weights
  stream piece by piece, so that release keeps our own channel.
- 0.22 (the current Ascend images run 0.23): ``Worker.start_weight_update(is_checkpoint_format)``,
  ``update_weights(update_info)`` any number of times, ``finish_weight_update()``; the worker runs the
  layer-wise reload around the engine's ``receive_weights(update_info, load_weights)``; engines are built
  as ``(config, parallel_config, model)``; the trainer side is the engine class's static ``trainer_init`` /
  ``trainer_send_weights`` (vLLM's ``nccl``, vllm-ascend's ``hccl``).
- 0.32 (CPU / CUDA): the engine owns the lifecycle (its own ``start_weight_update`` /
  ``finish_weight_update``, ``receive_weights(update_info)`` loading into its model), engines are built
  as ``(config, vllm_config, device, model)``, ``LLM`` has no weight-update methods any more (the worker's
  are reached through ``collective_rpc``), and the NCCL trainer side moved to ``nccl_common.trainer_init``
  beside a ``TrainerWeightTransferEngine`` class.

What stays put, and what this module relies on: the four worker methods' names, a dense update's
``names`` / ``dtype_names`` / ``shapes``, an init info of ``master_address`` / ``master_port`` /
``rank_offset`` / ``world_size`` (worker rank = offset + DP index x world size + rank), and the unpacked
wire: one broadcast from rank 0 per tensor, in ``names`` order.

On CPU, where vLLM has no engine, :data:`GLOO_BACKEND` registers one of ours in vLLM's engine factory: the
same lifecycle over a gloo group, so the native path runs (and is tested) end to end on CPU too.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

WORKER_LIFECYCLE = "worker-lifecycle"
"""0.22-0.2x: the worker runs start / update / finish around the engine's ``receive_weights``."""
ENGINE_LIFECYCLE = "engine-lifecycle"
"""0.3x: the engine owns start / update / finish."""
GLOO_BACKEND = "mindspeed_rl_gloo"


def native_api() -> Optional[str]:
    """Which native weight-transfer API the installed vLLM has (None: none we can stream through)."""
    try:
        from vllm.distributed.weight_transfer.base import WeightTransferEngine
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError:
        return None
    if not callable(getattr(Worker, "start_weight_update", None)):
        return None
    return (
        ENGINE_LIFECYCLE if callable(getattr(WeightTransferEngine, "start_weight_update", None)) else WORKER_LIFECYCLE
    )


def unavailable_reason() -> Optional[str]:
    """Why the native path cannot run with the installed vLLM (None when it can)."""
    if native_api() is not None:
        return None
    try:
        import vllm

        release = f"vLLM {vllm.__version__}"
    except ImportError:
        return "vLLM is not importable"
    return f"{release} has no streamed weight-update API (start / update / finish, vLLM 0.22 and later)"


def _engine_factory():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    return WeightTransferEngineFactory


def engine_class(backend: str):
    """The worker-side engine class registered under ``backend`` (KeyError naming the known ones)."""
    registry = _engine_factory()._registry
    if backend not in registry:
        raise KeyError(f"vLLM has no weight-transfer engine {backend!r} (registered: {', '.join(sorted(registry))})")
    return registry[backend]()


# ----- the gloo engine (CPU) ----------------------------------------------------------------------------
class _GlooGroup:
    """A gloo group over a TCP store of its own, with the ``broadcast(tensor, src)`` of vLLM's communicators."""

    def __init__(self, host: str, port: int, rank: int, size: int, timeout_s: float = 1800.0):
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("vllm-weights", self.store), rank, size, timeout)

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        from .group_ops import broadcast_from

        broadcast_from(self.group, tensor, src)


def register_gloo_engine() -> str:
    """Register our gloo engine in vLLM's factory (once per process); returns its backend name."""
    factory = _engine_factory()
    if GLOO_BACKEND in factory._registry:
        return GLOO_BACKEND
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )

    @dataclasses.dataclass
    class GlooInitInfo(WeightTransferInitInfo):
        master_address: str
        master_port: int
        rank_offset: int
        world_size: int

    @dataclasses.dataclass
    class GlooUpdateInfo(WeightTransferUpdateInfo):
        names: List[str]
        dtype_names: List[str]
        shapes: List[List[int]]

    class GlooWeightTransferEngine(WeightTransferEngine):
        """Full tensors over gloo, loaded through the model's ``load_weights`` inside vLLM's layer-wise reload
        (run by the worker on 0.22-0.2x, by :meth:`start_weight_update` / :meth:`finish_weight_update` on 0.3x)."""

        init_info_cls = GlooInitInfo
        update_info_cls = GlooUpdateInfo

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.group: Optional[_GlooGroup] = None

        def init_transfer_engine(self, init_info) -> None:
            parallel = self.parallel_config
            rank = init_info.rank_offset + parallel.data_parallel_index * parallel.world_size + parallel.rank
            self.group = _GlooGroup(init_info.master_address, init_info.master_port, rank, init_info.world_size)

        def receive_weights(self, update_info, load_weights=None) -> None:
            load = load_weights or self.model.load_weights
            for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
                weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
                self.group.broadcast(weight, src=0)
                load([(name, weight)])

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def shutdown(self) -> None:
            self.group = None

        @staticmethod
        def trainer_init(init_info: Dict[str, Any]) -> _GlooGroup:
            return _GlooGroup(init_info["master_address"], init_info["master_port"], 0, init_info["world_size"])

        @staticmethod
        def trainer_send_weights(iterator, trainer_args) -> None:
            for _, tensor in iterator:
                trainer_args["group"].broadcast(tensor, src=0)

    factory.register_engine(GLOO_BACKEND, GlooWeightTransferEngine)
    return GLOO_BACKEND


# ----- the trainer (sender) side ------------------------------------------------------------------------
def open_sender(backend: str, host: str, port: int, world_size: int) -> Any:
    """Join the transfer group of ``backend`` as its rank 0; returns a communicator with
    ``broadcast(tensor, src)``. The engine's static ``trainer_init`` where it has one (0.22-0.2x, our gloo
    engine), else the NCCL rendezvous 0.3x moved into ``nccl_common``."""
    info = {"master_address": host, "master_port": port, "world_size": world_size}
    opener = inspect.getattr_static(engine_class(backend), "trainer_init", None)
    if isinstance(opener, staticmethod):
        return opener.__func__(info)
    from vllm.distributed.weight_transfer.nccl_common import trainer_init

    return trainer_init(info)


def send(group: Any, tensors: Iterable[torch.Tensor]) -> None:
    """The unpacked wire: one broadcast from rank 0 per tensor, in the order of the update's names."""
    for tensor in tensors:
        group.broadcast(tensor, src=0)


# ----- the worker (receiver) side: all through collective_rpc, which every release has ----------------
def _rank_without_offset(worker: Any) -> int:
    parallel = worker.vllm_config.parallel_config
    return parallel.data_parallel_index * parallel.world_size + parallel.rank


def init_receiver(llm: Any, host: str, port: int, rank: int, world_size: int) -> None:
    """Join this in-process engine's worker to the transfer group as ``rank`` (the engines compute their rank
    from an offset, which is chosen here so that it comes out as ``rank``)."""
    (own,) = llm.collective_rpc(_rank_without_offset)
    info = {"master_address": host, "master_port": port, "rank_offset": rank - own, "world_size": world_size}
    llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": info})


def start_update(llm: Any) -> None:
    llm.collective_rpc("start_weight_update")


def update(llm: Any, meta: Sequence[Tuple[str, Tuple[int, ...], torch.dtype]]) -> None:
    """Receive one chunk whose (name, shape, dtype) are ``meta`` while the sender broadcasts it."""
    info = {
        "names": [name for name, _, _ in meta],
        "dtype_names": [str(dtype).removeprefix("torch.") for _, _, dtype in meta],
        "shapes": [list(shape) for _, shape, _ in meta],
    }
    llm.collective_rpc("update_weights", kwargs={"update_info": info})


def finish_update(llm: Any) -> None:
    from .vllm import reset_caches_after_update

    llm.collective_rpc("finish_weight_update")
    reset_caches_after_update(llm)
