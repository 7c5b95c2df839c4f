"""What the last pipeline stage computed, shared with the engine's other ranks: a step's metrics summed over
micro-batches and data-parallel ranks, and forward outputs broadcast over the pipeline group so that every
rank of the model-parallel group returns them."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist


def reduce_metrics(stores: List[Dict], pp_last: bool, dp_size: int, device: torch.device) -> Dict[str, float]:
    """Each metric summed over micro-batches and DP ranks (they are shares of the mini-batch). ``stores``: the
    micro-batches' metrics on the last stage; ``device``: where the collectives run."""
    from megatron.core import parallel_state as ps

    keys = [sorted(stores[0]) if stores else []]
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast_object_list(
            keys, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
    keys = keys[0]
    values = torch.tensor(
        [float(sum(float(s[k]) for s in stores)) if pp_last else 0.0 for k in keys],
        dtype=torch.float64,
        device=device,
    )
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast(
            values, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
    if dp_size > 1:
        dist.all_reduce(values, group=ps.get_data_parallel_group())
    return {k: float(v) for k, v in zip(keys, values.tolist())}


def broadcast_from_last_stage(
    outputs: Optional[Dict[str, torch.Tensor]], device: torch.device
) -> Dict[str, torch.Tensor]:
    """The last stage's ``outputs`` (None on the other stages) on every rank of the pipeline group, on the
    host; ``device``: where the broadcasts run."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return {k: v.cpu() for k, v in outputs.items()}
    src = ps.get_pipeline_model_parallel_last_rank()
    group = ps.get_pipeline_model_parallel_group()
    names = [sorted(outputs) if outputs is not None else None]
    dist.broadcast_object_list(names, src=src, group=group)
    shapes = [{k: tuple(v.shape) for k, v in outputs.items()} if outputs is not None else None]
    dist.broadcast_object_list(shapes, src=src, group=group)
    result = {}
    for name in names[0]:
        t = outputs[name].float().contiguous() if outputs is not None else torch.empty(shapes[0][name])
        t = t.to(device)
        dist.broadcast(t, src=src, group=group)
        result[name] = t.cpu()
    return result
