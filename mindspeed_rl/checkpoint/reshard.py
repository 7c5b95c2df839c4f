"""Megatron -> Megatron with another TP x PP x EP: the weights, and for a training checkpoint the run.

A training checkpoint (an iteration folder written by a run) keeps its iteration, the trainer state
(data position, KL controller, parked samples) and the scheduler; Adam's moments and fp32 main weights
are rebuilt per parameter name (``optimizer_state``) and split exactly like the weight of that name,
so a resume at the new layout continues with the same optimizer. The RNG state belongs to the old
ranks and is left out. A 'release' folder (converted weights) stays weights only.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..config_cls.model_config import ModelConfig
from . import megatron_layout as ml
from . import optimizer_state
from .convert import DTYPES, StageShards, check_parallel, checkpoint_config, target_layers
from .errors import ConversionError
from .megatron_reader import iter_mg_stages, read_mg_config, stage_rank_shards
from .sharding import stored_stage_layers, to_global
from .tp_split import layer_number, merge_tp

KINDS = ("param",) + optimizer_state.MOMENTS


def _rank_named_optimizer(path: str) -> Dict[str, Dict[str, Any]]:
    """Full (TP-local) optimizer tensors per parameter name of one rank folder (its model file and, with
    the distributed optimizer, every data-parallel rank's shard file)."""
    optim = ml.safe_load(path, mmap=True).get("optimizer") or {}
    if "named" in optim:
        return optim["named"]
    folder = os.path.dirname(path)
    if "optimizer" in optim:
        if "layout" not in optim:
            raise ConversionError(
                f"{path}: the optimizer state does not record its parameter names (saved by an "
                "older version); reshard with --weights-only and resume with no_load_optim=true"
            )
        native = optim["optimizer"] if isinstance(optim["optimizer"], list) else [optim["optimizer"]]
        inner = [sd["optimizer"] if "optimizer" in sd else sd for sd in native]
        pieces = [optimizer_state.named_from_native(optim["layout"], inner, optim.get("mains"))]
    else:
        shard_files = sorted(n for n in os.listdir(folder) if n.startswith("distrib_optim_dp"))
        if not shard_files:
            raise ConversionError(
                f"{folder}: no optimizer state (saved with no_save_optim?); reshard with "
                "--weights-only and resume with no_load_optim=true"
            )
        pieces = []
        for name in shard_files:
            saved = ml.safe_load(os.path.join(folder, name), mmap=True)
            if not isinstance(saved, dict):
                raise ConversionError(
                    f"{os.path.join(folder, name)}: the optimizer shard does not record its "
                    "parameter names (saved by an older version); reshard with --weights-only "
                    "and resume with no_load_optim=true"
                )
            pieces.append(optimizer_state.named_from_native(saved["layout"], saved["optimizers"], saved["mains"]))
    try:
        return optimizer_state.assemble(pieces)
    except ValueError as exc:
        raise ConversionError(f"{folder}: {exc}") from None


def _optimizer_stages(
    iter_dir: str,
    layout: Tuple[int, int, int],
    layers: List[List[int]],
    swiglu: bool,
    num_experts: Optional[int],
) -> Tuple[Dict[str, Dict[str, torch.Tensor]], Dict[str, float]]:
    """{kind: {global name: full tensor}} for kind in param / exp_avg / exp_avg_sq, and the step per name."""
    pp = layout[1]
    full: Dict[str, Dict[str, torch.Tensor]] = {k: {} for k in KINDS}
    steps: Dict[str, float] = {}
    for pp_rank in range(pp):
        per_tp = stage_rank_shards(iter_dir, pp_rank, layout, num_experts, read=_rank_named_optimizer)
        for name in per_tp[0]:
            global_name = to_global(name, layers[pp_rank])
            steps[global_name] = per_tp[0][name].get("step")
            for kind in KINDS:
                if kind in per_tp[0][name]:
                    full[kind][global_name] = merge_tp(global_name, [s[name][kind] for s in per_tp], swiglu).clone()
    return full, steps


def _in_stage(name: str, pp_rank: int, pp: int, layers: Sequence[int]) -> bool:
    layer = layer_number(name)
    if layer >= 0:
        return layer in layers
    return (pp_rank == 0) if name.startswith("embedding.") else (pp_rank == pp - 1)


def mg_to_mg(
    load_dir: str,
    save_dir: str,
    tp: int,
    pp: int,
    num_layer_list: Optional[str] = None,
    dtype: Optional[str] = None,
    ep: int = 1,
    weights_only: bool = False,
    per_virtual_stage: Optional[int] = None,
) -> Tuple[Any, bool]:
    """Reshard ``load_dir``'s latest checkpoint to TP x PP x EP under ``save_dir``. Returns (the iteration
    written: the source's for a training checkpoint, else 'release'; whether optimizer state was kept)."""
    config, iter_dir, _, _ = read_mg_config(load_dir)
    iteration = ml.read_tracker(load_dir)
    _, source_pp, source_ep = ml.full_layout_of(iter_dir)
    first = ml.safe_load(ml.rank_file(iter_dir, 0, 0, source_pp, 0, source_ep), mmap=True)
    training = iteration != "release" and not weights_only
    keep_optim = training and first.get("optimizer") is not None
    cfg = ModelConfig(**config["model"])
    check_parallel(cfg, tp, ep)
    layers = target_layers(cfg.num_layers, pp, num_layer_list, per_virtual_stage)
    dtype_name = dtype or config.get("params_dtype", "fp32")
    # the new layout stores its whole model (an adapter-only source is completed from its base)
    lora = {k: v for k, v in config["lora"].items() if k != "base"} if config.get("lora") else None
    out_config = checkpoint_config(cfg, tp, pp, layers, dtype_name, config.get("orm", False), ep, lora)
    full: Dict[str, torch.Tensor] = {}
    for _, stage in iter_mg_stages(load_dir, fold=False):  # adapters stay adapters: the run goes on
        full.update({k: (v.to(DTYPES[dtype]) if dtype else v).clone() for k, v in stage.items()})
    optim_full, step = {}, None
    if keep_optim:
        optim_full, steps = _optimizer_stages(
            iter_dir, ml.full_layout_of(iter_dir), stored_stage_layers(config), cfg.swiglu, cfg.num_experts
        )
        # Adam's step count: one per optimizer step, the same for every parameter
        step = max((s for s in steps.values() if s is not None), default=None)
    target = iteration if training else "release"
    common: Dict[str, Any] = {"iteration": iteration if training else 0, "config": out_config}
    if training and first.get("trainer_state") is not None:
        common["trainer_state"] = first["trainer_state"]
    ml.begin_save(save_dir, target)
    for pp_rank in range(pp):
        shard = functools.partial(StageShards, tp, layers[pp_rank], cfg.swiglu, ep, cfg.num_experts)
        model, kinds = shard(), {kind: shard() for kind in optim_full}
        for n, t in full.items():
            if _in_stage(n, pp_rank, pp, layers[pp_rank]):
                model.add(n, t)
                for kind, stage in kinds.items():
                    if n in optim_full[kind]:
                        stage.add(n, optim_full[kind][n])
        for tp_rank in range(tp):
            for ep_rank in range(ep):
                payload = dict(common, model=model.take(tp_rank, ep_rank))
                if keep_optim:
                    named: Dict[str, Dict[str, Any]] = {}
                    for kind, stage in kinds.items():
                        for n, tensor in stage.take(tp_rank, ep_rank).items():
                            named.setdefault(n, {"step": step})[kind] = tensor
                    payload["optimizer"] = {"scheduler": first["optimizer"]["scheduler"], "named": named}
                ml.write_rank(save_dir, target, tp_rank, pp_rank, pp, payload, ep_rank, ep)
    ml.commit_save(save_dir, target, tp * pp * ep)
    return target, keep_optim
