"""Full (TP=1, PP=1) megatron state dicts <-> the shard of one (TP rank, PP stage).

A stage numbers its layers from 0 in its own order; ``stage_layers[r]`` lists the global layer numbers of pipeline
rank r in that order: a contiguous block, or with an interleaved pipeline (VPP) its model chunks' blocks.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

import torch

from ..config_cls.megatron_config import pipeline_layers
from .tp_split import layer_number, merge_tp, shift_layer, split_tp

StateDict = Dict[str, torch.Tensor]
# per pipeline rank: its layer count (a contiguous block) or its global layer numbers in its own order
StageLayout = Union[Sequence[int], Sequence[Sequence[int]]]


def stage_layers(layout: StageLayout) -> List[List[int]]:
    """Per pipeline rank, its global layer numbers in its own order (layer counts: contiguous blocks)."""
    if all(isinstance(x, int) for x in layout):
        counts = [int(x) for x in layout]  # type: ignore[arg-type]
        return pipeline_layers(sum(counts), len(counts), 1, counts)
    return [list(layers) for layers in layout]  # type: ignore[arg-type]


def stored_stage_layers(config: dict) -> List[List[int]]:
    """The layout a checkpoint's stored config records (``stage_layers`` with VPP, else ``num_layer_list``)."""
    if config.get("stage_layers"):
        return [list(layers) for layers in config["stage_layers"]]
    return stage_layers([int(x) for x in config["num_layer_list"].split(",")])


def layer_owners(layers: Sequence[Sequence[int]]) -> Dict[int, Tuple[int, int]]:
    """global layer -> (pipeline rank holding it, its number on that rank), in global order."""
    owners = {g: (rank, i) for rank, held in enumerate(layers) for i, g in enumerate(held)}
    return dict(sorted(owners.items()))


def to_global(name: str, layers: Sequence[int]) -> str:
    """A stage-local name under its global layer number (names without a layer unchanged)."""
    local = layer_number(name)
    return shift_layer(name, layers[local] - local) if local >= 0 else name


def to_local(name: str, index: Dict[int, int]) -> str:
    """A global name under the stage's own layer number; ``index``: global -> local of the stage."""
    layer = layer_number(name)
    return shift_layer(name, index[layer] - layer) if layer >= 0 else name


def shard_state_dict(
    full: StateDict, tp: int, tp_rank: int, layout: StageLayout, pp_rank: int, swiglu: bool = True
) -> StateDict:
    """The weights one (TP rank, PP stage) holds, with stage-local layer numbers."""
    layers = stage_layers(layout)
    pp = len(layers)
    index = {g: i for i, g in enumerate(layers[pp_rank])}
    out: StateDict = {}
    for name, tensor in full.items():
        layer = layer_number(name)
        if layer >= 0:
            if layer not in index:
                continue
            local = to_local(name, index)
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


def merge_state_dicts(shards: Sequence[Sequence[StateDict]], layout: StageLayout, swiglu: bool = True) -> StateDict:
    """Full weights from ``shards[pp_rank][tp_rank]`` (stage-local layer numbers)."""
    layers = stage_layers(layout)
    full: StateDict = {}
    for pp_rank, tp_shards in enumerate(shards):
        for name in tp_shards[0]:
            global_name = to_global(name, layers[pp_rank])
            full[global_name] = merge_tp(global_name, [s[name] for s in tp_shards], swiglu)
    return full
