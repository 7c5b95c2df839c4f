"""torch.distributed and megatron parallel-state set-up for one process group."""

from __future__ import annotations

import os
import socket
from typing import Optional

import torch
import torch.distributed as dist

from ..accelerator import get_accelerator
from ..compat import megatron_core as compat_megatron

FIXED_PORTS = range(20000, 32768)  # above Ray's worker ports (10002-19999), below Linux's ephemeral range


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for a process group's rendezvous that binds it a moment later.

    A port the OS hands out for bind(0) comes from the ephemeral range, which every outgoing connection
    (Ray's gRPC channels open many) also draws from: one of them can take it before the group binds it
    (EADDRINUSE). Ports below the ephemeral range are only taken by an explicit bind, so pick there.
    """
    import random

    low = min(FIXED_PORTS.stop, _ephemeral_low())
    candidates = random.Random().sample(range(FIXED_PORTS.start, low), k=min(64, max(0, low - FIXED_PORTS.start)))
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded machine: any free port
        sock.bind((host, 0))
        return sock.getsockname()[1]


def init_distributed(
    rank: int = 0,
    world_size: int = 1,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    local_rank: Optional[int] = None,
) -> None:
    """Initialise torch.distributed with the device's backend (hccl / nccl / gloo)."""
    if dist.is_initialized():
        return
    acc = get_accelerator()
    os.environ["MASTER_ADDR"] = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    # A world of one meets nobody, so it takes a free port rather than an inherited MASTER_PORT that
    # another process group (a parent's, an earlier run's) may still hold.
    inherited = os.environ.get("MASTER_PORT") if world_size > 1 else None
    os.environ["MASTER_PORT"] = str(master_port or inherited or free_port())
    acc.set_device(rank if local_rank is None else local_rank)
    dist.init_process_group(acc.dist_backend, rank=rank, world_size=world_size)


def init_model_parallel(tp: int = 1, pp: int = 1, seed: int = 1234, ep: int = 1, cp: int = 1, vpp: int = 1) -> None:
    """megatron parallel_state for TP x PP x CP (DP is what remains; EP splits the experts over DP ranks; VPP
    model chunks per pipeline rank), and the model-parallel RNG."""
    # the device's patches first: MindSpeed's adaptor must patch megatron-core before anything imports it
    get_accelerator().prepare_megatron()
    compat_megatron.apply()
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            expert_model_parallel_size=ep,
            context_parallel_size=cp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        )
    # Every rank seeds identically first: with CPU initialisation megatron DDP does not
    # broadcast initial parameters, so replicas must build identical weights.
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def destroy() -> None:
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        compat_megatron.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
