"""Weights from the actor to rollout workers that live in other processes (the disaggregated layout).

One process group per rollout engine spans the actor's sending rank (rank 0 of the group) and the engine's ranks
(``WeightFanOut`` sends to all of them, dropping an engine whose stream breaks). Each is built from a TCP store of
its own, so neither side's training or inference world has to know the other.

The stream is the resharding stream (``rollout/weights/resharding.py``): full megatron-named tensors, one model
piece at a time. For each piece the sender broadcasts its names, shapes and dtypes (over gloo, on the host),
then each tensor; a ``None`` in place of that list ends the stream. Two ways carry the tensors:

- :class:`WeightChannel` (``generate_config.weight_transfer: channel``): a broadcast group of the device's
  collective library (``Accelerator.transfer_group``; gloo on CPU). Every receiver gets full megatron-named
  tensors and its engine converts and shards them for its own infer-TP rank, as in the colocated layout.
- :class:`VllmNativeChannel` (``vllm_native``): vLLM's own weight-transfer engine in each rollout worker
  (``compat/vllm_weight_transfer.py``). The sender converts each piece to the HF names and dtype vLLM loads,
  and each chunk is received and loaded inside vLLM's update lifecycle.
"""

from __future__ import annotations

import datetime
import pickle
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from ...accelerator import get_accelerator
from ...compat.group_ops import broadcast_from
from ...utils.cli import first_line

Meta = List[Tuple[str, Tuple[int, ...], torch.dtype]]
Named = List[Tuple[str, torch.Tensor]]


def _as_is(piece: Dict[str, torch.Tensor]) -> Named:
    return list(piece.items())


class WeightChannel:
    """The sender (rank 0) and the receivers of one weight stream; tensors over ``Accelerator.transfer_group``."""

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        size: int,
        device: torch.device,
        timeout_s: float = 1800.0,
        prepare: Callable[[Dict[str, torch.Tensor]], Named] = _as_is,
    ):
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout)
        self.rank, self.size, self.device, self.prepare = rank, size, device, prepare
        # names, shapes and dtypes travel on the host; the tensors over the group of _tensor_group
        self.control = dist.ProcessGroupGloo(dist.PrefixStore("meta", self.store), rank, size, timeout)
        self.group = self._tensor_group(timeout)

    def _tensor_group(self, timeout: datetime.timedelta):
        return get_accelerator().transfer_group(dist.PrefixStore("weights", self.store), self.rank, self.size, timeout)

    def _broadcast_meta(self, meta: Optional[Meta] = None) -> Optional[Meta]:
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(meta)), dtype=torch.uint8)
            broadcast_from(self.control, torch.tensor([payload.numel()], dtype=torch.long))
            broadcast_from(self.control, payload)
            return meta
        length = broadcast_from(self.control, torch.zeros(1, dtype=torch.long))
        payload = broadcast_from(self.control, torch.empty(int(length.item()), dtype=torch.uint8))
        return pickle.loads(payload.numpy().tobytes())

    def _metas(self) -> Iterator[Meta]:
        """Each piece's (name, shape, dtype) as the sender announces it, until the end of the stream."""
        while (meta := self._broadcast_meta()) is not None:
            yield meta

    def _send_tensors(self, tensors: List[torch.Tensor]) -> None:
        for tensor in tensors:
            broadcast_from(self.group, tensor)

    def send(self, pieces: Iterable[Dict[str, torch.Tensor]]) -> Dict[str, float]:
        """Stream ``pieces`` to every receiver (rank 0 only); returns tensor and byte counts."""
        count = {"tensors": 0.0, "bytes": 0.0}
        for piece in pieces:
            names, tensors = self.staged(piece)
            self.send_piece(names, tensors)
            count["tensors"] += len(tensors)
            count["bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        self.end_stream()
        return count

    def staged(self, piece: Dict[str, torch.Tensor]) -> Tuple[List[str], List[torch.Tensor]]:
        """A piece as this channel sends it: its names and tensors, prepared and on the channel's device."""
        named = self.prepare(piece)
        return [name for name, _ in named], [tensor.detach().to(self.device).contiguous() for _, tensor in named]

    def send_piece(self, names: List[str], tensors: List[torch.Tensor]) -> None:
        self._broadcast_meta([(name, tuple(t.shape), t.dtype) for name, t in zip(names, tensors)])
        self._send_tensors(tensors)

    def end_stream(self) -> None:
        self._broadcast_meta(None)

    def receive(self) -> Iterator[Dict[str, torch.Tensor]]:
        """The pieces the sender streams, one at a time (receivers)."""
        for meta in self._metas():
            yield {
                name: broadcast_from(self.group, torch.empty(shape, dtype=dtype, device=self.device))
                for name, shape, dtype in meta
            }

    def load_into(self, engine) -> Dict[str, float]:
        """Receive one stream into rollout ``engine`` (receivers); its update statistics."""
        return engine.update_weights(self.receive())

    def close(self) -> None:
        self.group = self.control = None
        self.store = None


class WeightFanOut:
    """The sending end towards several rollout engines, one channel each: an engine that fails mid-stream (its
    channel raises, or passes its timeout) is dropped and named, and the stream to the others stays whole. Each
    piece is prepared once (every channel of a run prepares alike)."""

    def __init__(self) -> None:
        self.channels: Dict[int, WeightChannel] = {}

    def add(self, engine: int, channel: WeightChannel) -> None:
        self.drop(engine)
        self.channels[engine] = channel

    def drop(self, engine: int) -> None:
        channel = self.channels.pop(engine, None)
        if channel is not None:
            channel.close()

    def send(self, pieces: Iterable[Dict[str, torch.Tensor]], engines: Optional[List[int]] = None) -> Dict:
        """Stream ``pieces`` to ``engines`` (None: all); every piece is drawn (the gather behind them is a
        collective of the sending role). Returns tensor and byte counts and ``failed``: engine -> why."""
        targets = {e: c for e, c in self.channels.items() if engines is None or e in engines}
        count, failed = {"tensors": 0.0, "bytes": 0.0}, {}

        def each(action) -> None:
            for engine, channel in list(targets.items()):
                try:
                    action(channel)
                except RuntimeError as exc:  # gloo / the collective library: a peer gone or past the timeout
                    failed[engine] = first_line(exc, 300)
                    del targets[engine]
                    self.drop(engine)

        for piece in pieces:
            if not targets:
                continue
            names, tensors = next(iter(targets.values())).staged(piece)
            each(lambda channel: channel.send_piece(names, tensors))
            count["tensors"] += len(tensors)
            count["bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        each(lambda channel: channel.end_stream())
        return {**count, "failed": failed}


class VllmNativeChannel(WeightChannel):
    """The tensors through vLLM's weight-transfer engine ``backend``: on the sender a communicator of that
    engine's group (rank 0), on each receiver the engine inside its vLLM worker, joined here as channel rank
    ``rank``. ``prepare`` (sender) turns a megatron piece into the HF-named tensors vLLM loads."""

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        size: int,
        device: torch.device,
        backend: str,
        native_port: int,
        engine=None,
        timeout_s: float = 1800.0,
        prepare: Callable[[Dict[str, torch.Tensor]], Named] = _as_is,
    ):
        self.host, self.backend, self.native_port, self.engine = host, backend, native_port, engine
        super().__init__(host, port, rank, size, device, timeout_s, prepare)

    def _tensor_group(self, timeout: datetime.timedelta):
        from ...compat import vllm_weight_transfer as native

        if self.rank == 0:
            return native.open_sender(self.backend, self.host, self.native_port, self.size)
        self.engine.join_weight_transfer(self.host, self.native_port, self.rank, self.size)
        return None  # the receiving end lives in the engine's vLLM worker

    def _send_tensors(self, tensors: List[torch.Tensor]) -> None:
        from ...compat import vllm_weight_transfer as native

        native.send(self.group, tensors)

    def receive(self) -> Iterator[Dict[str, torch.Tensor]]:
        raise TypeError("vLLM's weight-transfer engine loads what it receives: use load_into(engine)")

    def load_into(self, engine) -> Dict[str, float]:
        return engine.update_weights_natively(self._metas())
