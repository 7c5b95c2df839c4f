"""Full (TP=1, PP=1) megatron state dicts <-> the shard of one (TP rank, PP stage)."""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from .tp_split import layer_number, merge_tp, shift_layer, split_tp

StateDict = Dict[str, torch.Tensor]


def stage_starts(layer_counts: Sequence[int]) -> List[int]:
    starts, total = [], 0
    for count in layer_counts:
        starts.append(total)
        total += count
    return starts


def shard_state_dict(
    full: StateDict, tp: int, tp_rank: int, layer_counts: Sequence[int], pp_rank: int, swiglu: bool = True
) -> StateDict:
    """The weights one (TP rank, PP stage) holds, with stage-local layer numbers."""
    pp = len(layer_counts)
    start = stage_starts(layer_counts)[pp_rank]
    end = start + layer_counts[pp_rank]
    out: StateDict = {}
    for name, tensor in full.items():
        layer = layer_number(name)
        if layer >= 0:
            if not start <= layer < end:
                continue
            local = shift_layer(name, -start)
        elif name.startswith(("embedding.", "visual.")):  # a vision tower lives on the first stage too
            if pp_rank != 0:
                continue
            local = name
        elif pp_rank != pp - 1:
            continue
        else:
            local = name
        out[local] = split_tp(name, tensor, tp, tp_rank, swiglu).clone()
    return out


def merge_state_dicts(
    shards: Sequence[Sequence[StateDict]], layer_counts: Sequence[int], swiglu: bool = True
) -> StateDict:
    """Full weights from ``shards[pp_rank][tp_rank]`` (stage-local layer numbers)."""
    starts = stage_starts(layer_counts)
    full: StateDict = {}
    for pp_rank, tp_shards in enumerate(shards):
        for name in tp_shards[0]:
            global_name = shift_layer(name, starts[pp_rank])
            full[global_name] = merge_tp(global_name, [s[name] for s in tp_shards], swiglu)
    return full
