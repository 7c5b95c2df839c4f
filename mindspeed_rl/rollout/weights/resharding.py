"""Megatron shards of any TP x PP -> full weights, streamed piece by piece (bounded memory).

Every rank of the actor's model-parallel group iterates the same sequence of pieces
(embedding, layer 0..L-1, final norm + output layer). For each piece its owning pipeline stage
all-gathers the TP shards and merges them (megatron's TP rules), then broadcasts the full
tensors to the other stages; every rank then holds the full piece, which the rollout engine
loads into its own (inference) layout: vLLM shards it for its TP rank itself, so inference TP
equal to, a multiple of, or a divisor of the training TP all work the same way. With expert
parallelism each expert is also all-gathered over the EP group (rank r's local expert j is
global expert r * E/EP + j).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import torch
import torch.distributed as dist

from ...checkpoint.sharding import layer_owners, to_global
from ...checkpoint.tp_split import expert_number, layer_number, merge_tp, renumber_expert


def _pieces(layers: List[List[int]]) -> List[Tuple[str, int, int]]:
    """(kind, owning stage, local layer) for every piece, in load order (layers in global order; ``layers``:
    each stage's global layers in its own order)."""
    pieces = [("embedding", 0, -1)]
    pieces += [("layer", stage, local) for stage, local in layer_owners(layers).values()]
    pieces.append(("final", len(layers) - 1, -1))
    return pieces


def _piece_of(name: str) -> Tuple[str, int]:
    """(kind, local layer) of the piece a weight belongs to."""
    if name.startswith("embedding."):
        return "embedding", -1
    layer = layer_number(name)
    return ("layer", layer) if layer >= 0 else ("final", -1)


def iter_full_weights(engine) -> Iterator[Dict[str, torch.Tensor]]:
    """Full megatron-named tensors (global layer numbers), one piece at a time, on every rank."""
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    pp = ps.get_pipeline_model_parallel_world_size()
    pp_rank = ps.get_pipeline_model_parallel_rank()
    tp_group, pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
    ep = ps.get_expert_model_parallel_world_size()
    ep_group = ps.get_expert_model_parallel_group() if ep > 1 else None
    experts_per_rank = (engine.role.model.num_experts or ep) // ep
    layers = engine.megatron.stage_layers(engine.role.model.num_layers)
    swiglu = engine.role.model.swiglu
    comm = engine.acc.comm_device(engine.device)
    sources = engine.export_weight_sources()  # with LoRA each weight is merged when read, not the whole rank
    by_piece: Dict[Tuple[str, int], List[str]] = {}
    for name in sources:
        by_piece.setdefault(_piece_of(name), []).append(name)
    for kind, stage, local_layer in _pieces(layers):
        full: Dict[str, torch.Tensor] = {}
        if pp_rank == stage:
            for name in sorted(by_piece.get((kind, local_layer), [])):
                shard = sources[name]().detach()
                if tp > 1:
                    parts = [torch.empty_like(shard, device=comm) for _ in range(tp)]
                    dist.all_gather(parts, shard.to(comm).contiguous(), group=tp_group)
                else:
                    parts = [shard]
                global_name = to_global(name, layers[stage])
                merged = merge_tp(global_name, parts, swiglu)
                expert = expert_number(name)
                if expert >= 0 and ep > 1:
                    gathered = [torch.empty_like(merged, device=comm) for _ in range(ep)]
                    dist.all_gather(gathered, merged.to(comm).contiguous(), group=ep_group)
                    for ep_rank, tensor in enumerate(gathered):
                        full[renumber_expert(global_name, ep_rank * experts_per_rank + expert)] = tensor
                else:
                    full[global_name] = merged
        if pp > 1:
            src = (
                ps.get_pipeline_model_parallel_global_ranks()[stage]
                if hasattr(ps, "get_pipeline_model_parallel_global_ranks")
                else dist.get_global_rank(pp_group, stage)
            )
            meta: List[Any] = [[(n, tuple(t.shape), t.dtype) for n, t in full.items()] if pp_rank == stage else None]
            dist.broadcast_object_list(meta, src=src, group=pp_group)
            for name, shape, dtype in meta[0]:
                t = (
                    full[name].to(comm).contiguous()
                    if pp_rank == stage
                    else torch.empty(shape, dtype=dtype, device=comm)
                )
                dist.broadcast(t, src=src, group=pp_group)
                full[name] = t
        yield full
