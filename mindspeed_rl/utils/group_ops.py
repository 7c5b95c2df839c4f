"""Collectives over a process-group object of its own (outside the default world, e.g. built over a TCP store):
torch alone, so that the library adapters (compat/) use them without the device layer."""

from __future__ import annotations

import torch
import torch.distributed as dist


def broadcast_from(group, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """``tensor`` broadcast from rank ``src`` over a process-group object of its own (outside the default
    world, e.g. built over a TCP store), waited for; returns ``tensor``."""
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    group.broadcast([tensor], opts).wait()
    return tensor
