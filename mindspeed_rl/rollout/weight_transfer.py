"""Weights from the actor to rollout workers that live in other processes (the disaggregated layout).

One process group spans the actor's sending rank (rank 0 of the group) and every rollout rank. It is built
from a TCP store of its own, so neither side's training or inference world has to know the other: gloo on
CPU, the device's collective library elsewhere (``Accelerator.transfer_group``).

The stream is the resharding stream (``rollout/resharding.py``): full megatron-named tensors, one model
piece at a time. For each piece the sender broadcasts its names, shapes and dtypes, then each tensor; a
``None`` in place of that list ends the stream. Every receiver gets full tensors and its engine shards them for its own
infer-TP rank, as in the colocated layout.
"""

from __future__ import annotations

import datetime
import pickle
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..accelerator import get_accelerator

Meta = List[Tuple[str, Tuple[int, ...], torch.dtype]]


class WeightChannel:
    """The sender (rank 0) and the receivers of one weight stream."""

    def __init__(self, host: str, port: int, rank: int, size: int, device: torch.device, timeout_s: float = 1800.0):
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout)
        self.rank, self.size, self.device = rank, size, device
        self.group = get_accelerator().transfer_group(dist.PrefixStore("weights", self.store), rank, size, timeout)

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()
        return tensor

    def _broadcast_meta(self, meta: Optional[Meta] = None) -> Optional[Meta]:
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(meta)), dtype=torch.uint8)
            self._broadcast(torch.tensor([payload.numel()], dtype=torch.long))
            self._broadcast(payload)
            return meta
        length = self._broadcast(torch.zeros(1, dtype=torch.long))
        payload = self._broadcast(torch.empty(int(length.item()), dtype=torch.uint8))
        return pickle.loads(payload.numpy().tobytes())

    def send(self, pieces: Iterable[Dict[str, torch.Tensor]]) -> Dict[str, float]:
        """Stream ``pieces`` to every receiver (rank 0 only); returns tensor and byte counts."""
        count = {"tensors": 0.0, "bytes": 0.0}
        for piece in pieces:
            self._broadcast_meta([(name, tuple(t.shape), t.dtype) for name, t in piece.items()])
            for tensor in piece.values():
                self._broadcast(tensor.detach().to(self.device).contiguous())
                count["tensors"] += 1
                count["bytes"] += tensor.numel() * tensor.element_size()
        self._broadcast_meta(None)
        return count

    def receive(self) -> Iterator[Dict[str, torch.Tensor]]:
        """The pieces the sender streams, one at a time (receivers)."""
        while True:
            meta = self._broadcast_meta()
            if meta is None:
                return
            yield {
                name: self._broadcast(torch.empty(shape, dtype=dtype, device=self.device))
                for name, shape, dtype in meta
            }

    def close(self) -> None:
        self.group = None
        self.store = None
