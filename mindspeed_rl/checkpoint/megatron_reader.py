"""A Megatron checkpoint read back as full weights: the TP shards of each pipeline stage merged, the EP
ranks' experts joined under their global numbers, layers renumbered globally and LoRA adapters folded into
their weights (or kept). Rank files are memory-mapped, so tensors are read only when used.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from . import lora_base
from . import megatron_layout as ml
from .errors import ConversionError
from .sharding import layer_owners, stored_stage_layers, to_global
from .tp_split import expert_number, fold_lora, layer_number, merge_tp, renumber_expert


def read_mg_config(load_dir: str) -> Tuple[dict, str, int, int]:
    iteration, iter_dir = ml.latest_iteration_dir(load_dir)
    tp, pp, ep = ml.full_layout_of(iter_dir)
    first = ml.safe_load(ml.rank_file(iter_dir, 0, 0, pp, 0, ep), mmap=True)
    config = first.get("config")
    if not config or "model" not in config:
        raise ConversionError(f"{load_dir}: the checkpoint stores no model config")
    return config, iter_dir, tp, pp


def _rank_model(path: str) -> Dict[str, torch.Tensor]:
    """A rank file's whole model (an adapter-only LoRA file completed from its base checkpoint)."""
    rank_dir = os.path.dirname(path)
    where = os.path.dirname(os.path.dirname(rank_dir))
    return lora_base.complete(ml.safe_load(path, mmap=True), os.path.basename(rank_dir), where)["model"]


def stage_rank_shards(
    iter_dir: str,
    pp_rank: int,
    layout: Tuple[int, int, int],
    num_experts: Optional[int],
    read: Callable[[str], Dict[str, Any]] = _rank_model,
) -> List[Dict[str, Any]]:
    """The model shards of one pipeline stage, one dict per TP rank; with EP > 1 the EP ranks' files are
    joined, experts renamed to their global numbers (memory-mapped: tensors are read when used).
    ``layout``: the folder's (TP, PP, EP), from ``ml.full_layout_of``; ``read``: what to take from a rank
    file (default its model weights; the converter also reads the optimizer state per parameter name)."""
    tp, pp, ep = layout
    per = (num_experts or ep) // ep
    out = []
    for t in range(tp):
        joined: Dict[str, Any] = {}
        for e in range(ep):
            model = read(ml.rank_file(iter_dir, t, pp_rank, pp, e, ep))
            for name, tensor in model.items():
                expert = expert_number(name)
                if expert >= 0:
                    joined[renumber_expert(name, e * per + expert)] = tensor
                elif e == 0:
                    joined[name] = tensor
        out.append(joined)
    return out


def lora_scaling(config: dict) -> Optional[float]:
    """alpha / r of a checkpoint whose weights carry LoRA adapters (None: no adapters)."""
    lora = config.get("lora")
    return float(lora["alpha"]) / int(lora["r"]) if lora else None


def iter_mg_stages(load_dir: str, fold: bool = True) -> Iterator[Tuple[int, Dict[str, torch.Tensor]]]:
    """(pp_rank, full TP-merged weights of that stage with global layer numbers), stage by stage; LoRA
    adapters merged into their weights unless ``fold`` is false."""
    config, iter_dir, tp, pp = read_mg_config(load_dir)
    scaling = lora_scaling(config) if fold else None
    layers = stored_stage_layers(config)
    swiglu = config["model"].get("swiglu", True)
    experts, layout = config["model"].get("num_experts"), ml.full_layout_of(iter_dir)
    for pp_rank in range(pp):
        shards = stage_rank_shards(iter_dir, pp_rank, layout, experts)
        merged = {}
        for name in shards[0]:
            if name.endswith("_extra_state"):
                continue
            global_name = to_global(name, layers[pp_rank])
            merged[global_name] = merge_tp(global_name, [s[name] for s in shards], swiglu)
        yield pp_rank, fold_lora(merged, scaling) if scaling is not None else merged
        del shards, merged


def iter_mg_pieces(load_dir: str, fold: bool = True) -> Iterator[Dict[str, torch.Tensor]]:
    """The merged weights piece by piece (embedding and vision tower, each layer, final norm + head), global names; LoRA
    adapters merged into their weights unless ``fold`` is false.

    The rank files are re-opened (memory-mapped) for every piece and released after it, so the
    pages read stay out of the process's resident memory once a piece is merged.
    """
    config, iter_dir, tp, pp = read_mg_config(load_dir)
    layers = stored_stage_layers(config)
    swiglu = config["model"].get("swiglu", True)
    experts, layout = config["model"].get("num_experts"), ml.full_layout_of(iter_dir)
    scaling = lora_scaling(config) if fold else None

    def merged(pp_rank: int, wanted) -> Dict[str, torch.Tensor]:
        shards = stage_rank_shards(iter_dir, pp_rank, layout, experts)
        out = {}
        for name in shards[0]:
            if name.endswith("_extra_state") or not wanted(name):
                continue
            global_name = to_global(name, layers[pp_rank])
            out[global_name] = merge_tp(global_name, [s[name] for s in shards], swiglu).clone()
        del shards
        return fold_lora(out, scaling) if scaling is not None else out

    first = ("embedding.", "visual.")  # the first stage's own: the embedding and a vision tower
    yield merged(0, lambda n: n.startswith(first))
    for pp_rank, local in layer_owners(layers).values():  # in global order (with VPP the ranks interleave)
        yield merged(pp_rank, lambda n, i=local: layer_number(n) == i)
    yield merged(pp - 1, lambda n: layer_number(n) < 0 and not n.startswith(first))
