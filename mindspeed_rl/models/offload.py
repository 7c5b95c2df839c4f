"""Move an engine's params, grads and optimizer state to host memory and back.

Works at the level of tensor storages: the device storage is copied to host and resized to
zero bytes (freeing device memory), then re-grown and filled on onload. Tensor objects, views
into megatron's contiguous param/grad buffers and the optimizer's references all stay valid,
so nothing has to be rebuilt. On CPU the same mechanics run (the copy lives in a separate
host buffer), which keeps the logic tested on every machine.
"""

from __future__ import annotations

from typing import Dict, Iterable, List

import torch

from ..accelerator import get_accelerator


class _StorageStash:
    """Host copies of a set of storages, keyed by storage identity."""

    def __init__(self) -> None:
        self.host: Dict[int, torch.UntypedStorage] = {}
        self.storages: Dict[int, torch.UntypedStorage] = {}

    @property
    def offloaded(self) -> bool:
        return bool(self.host)

    def offload(self, tensors: Iterable[torch.Tensor]) -> int:
        pin = get_accelerator().pin_memory
        moved = 0
        for t in tensors:
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self.host or storage.nbytes() == 0:
                continue
            host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=pin).untyped_storage()
            host.copy_(storage)
            self.host[key] = host
            self.storages[key] = storage
            moved += storage.nbytes()
            storage.resize_(0)
        return moved

    def onload(self) -> int:
        moved = 0
        for key, storage in self.storages.items():
            host = self.host[key]
            storage.resize_(host.nbytes())
            storage.copy_(host)
            moved += host.nbytes()
        self.host.clear()
        self.storages.clear()
        return moved


class Offloader:
    """Offload/onload of one MegatronEngine's params, grads and optimizer state."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._stash = {"param": _StorageStash(), "grad": _StorageStash(), "optimizer": _StorageStash()}

    # what lives where
    def _buffers(self) -> List:
        out = []
        for chunk in self.engine.model:  # megatron DDP's contiguous buffers (a frozen model has none)
            for attr in ("buffers", "expert_parallel_buffers"):
                value = getattr(chunk, attr, None)
                if isinstance(value, list):
                    out.extend(value)
        return out

    def param_tensors(self) -> List[torch.Tensor]:
        tensors = [b.param_data for b in self._buffers() if getattr(b, "param_data", None) is not None]
        covered = {t.untyped_storage().data_ptr() for t in tensors}
        tensors += [p.data for p in self.engine.parameters() if p.data.untyped_storage().data_ptr() not in covered]
        return tensors

    def grad_tensors(self) -> List[torch.Tensor]:
        tensors = [b.grad_data for b in self._buffers() if getattr(b, "grad_data", None) is not None]
        if not tensors:
            tensors = [p.grad for p in self.engine.parameters() if p.grad is not None]
        return tensors

    def optimizer_tensors(self) -> List[torch.Tensor]:
        opt = self.engine.optimizer
        if opt is None:
            return []
        model_storages = {t.untyped_storage().data_ptr() for t in self.param_tensors()}
        tensors = []
        for inner in _inner_optimizers(opt):
            for group in inner.param_groups:
                for p in group["params"]:
                    if p.untyped_storage().data_ptr() not in model_storages:
                        tensors.append(p.data)  # fp32 main copy of bf16/fp16 params
            for state in inner.state.values():
                tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        return tensors

    # public API
    def offload(self, params: bool = True, grads: bool = True, optimizer: bool = True) -> Dict[str, int]:
        moved = {}
        if optimizer:
            moved["optimizer"] = self._stash["optimizer"].offload(self.optimizer_tensors())
        if grads:
            moved["grad"] = self._stash["grad"].offload(self.grad_tensors())
        if params:
            moved["param"] = self._stash["param"].offload(self.param_tensors())
        get_accelerator().empty_cache()
        return moved

    def onload(self) -> Dict[str, int]:
        moved = {name: stash.onload() for name, stash in self._stash.items() if stash.offloaded}
        get_accelerator().synchronize()
        return moved

    def is_offloaded(self, what: str) -> bool:
        return self._stash[what].offloaded


def _inner_optimizers(opt) -> List[torch.optim.Optimizer]:
    """The torch optimizers inside megatron's (possibly chained) optimizer."""
    chained = getattr(opt, "chained_optimizers", None)
    if chained:
        return [inner for sub in chained for inner in _inner_optimizers(sub)]
    inner = getattr(opt, "optimizer", None)
    return [inner] if isinstance(inner, torch.optim.Optimizer) else []
