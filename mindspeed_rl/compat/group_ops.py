"""Collectives over a process-group object of its own (outside the default world, e.g. built over a TCP store),
through torch's ProcessGroup object API (its options structs), which torch.distributed's functions do not take for
an unregistered group. Torch alone: vLLM's weight-transfer adapter here and the rollout's weight channel use it."""

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
