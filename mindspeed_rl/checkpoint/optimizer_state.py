"""Adam's state per named parameter: the form that can be split and merged like the weights.

megatron-core's optimizers hold their state by position (the inner torch optimizer's parameter index),
and the distributed optimizer only a flat range of each parameter per data-parallel rank. A slot ties
one position to the model parameter it trains:

    slot = (name, flat range [start, end) of the parameter this rank owns, main parameter, state)

Checkpoints record the slots' names and ranges beside the optimizer's own state, so a converter can
rebuild for every parameter name its full (TP-local) tensors

    named[name] = {"param": fp32 main weights, "exp_avg": m, "exp_avg_sq": v, "step": t}

which are split across tensor-parallel ranks exactly like the weight of that name. ``load_named`` puts a
named state into any optimizer layout (plain, mixed precision, distributed with any DP size).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

MOMENTS = ("exp_avg", "exp_avg_sq")
NamedState = Dict[str, Dict[str, Any]]


@dataclasses.dataclass
class Slot:
    name: str
    shape: Tuple[int, ...]  # the model parameter's (TP-local) shape
    start: int  # flat range of the parameter held by this slot
    end: int
    main: torch.Tensor  # the optimizer's (fp32) parameter: the whole parameter, or its [start, end) piece
    group: dict  # the inner torch optimizer's param group

    def describe(self) -> Tuple[str, Tuple[int, ...], int, int]:
        return self.name, self.shape, self.start, self.end


def sub_optimizers(opt) -> list:
    return list(getattr(opt, "chained_optimizers", None) or [opt])


def _main_to_model(sub) -> Dict[int, Tuple[torch.nn.Parameter, int, int]]:
    """id(main parameter) -> (model parameter, start, end) for one megatron optimizer."""
    out: Dict[int, Tuple[torch.nn.Parameter, int, int]] = {}
    if hasattr(sub, "shard_fp32_from_float16_groups"):  # distributed optimizer: a flat range per DP rank
        pairs = [
            (sub.model_float16_groups, sub.shard_fp32_from_float16_groups),
            (sub.model_fp32_groups, sub.shard_fp32_groups),
        ]
        for model_groups, main_groups in pairs:
            for model_group, main_group in zip(model_groups, main_groups):
                for model_param, main in zip(model_group, main_group):
                    rng = sub._get_model_param_range_map(model_param)["param"]
                    out[id(main)] = (model_param, rng.start, rng.end)
        return out
    for model_group, main_group in zip(
        getattr(sub, "float16_groups", []), getattr(sub, "fp32_from_float16_groups", [])
    ):
        for model_param, main in zip(model_group, main_group):
            out[id(main)] = (model_param, 0, model_param.numel())
    for group in sub.optimizer.param_groups:  # fp32 parameters are their own main copy
        for p in group["params"]:
            out.setdefault(id(p), (p, 0, p.numel()))
    return out


def slots(sub, names: Dict[int, str]) -> List[Slot]:
    """The slots of one megatron optimizer in the inner torch optimizer's index order (the order of its
    ``state_dict()``); ``names``: id(model parameter) -> name."""
    owners = _main_to_model(sub)
    out = []
    for group in sub.optimizer.param_groups:
        for main in group["params"]:
            model_param, start, end = owners[id(main)]
            out.append(Slot(names[id(model_param)], tuple(model_param.shape), start, end, main, group))
    return out


def engine_slots(engine) -> List[List[Slot]]:
    """Every sub-optimizer's slots (megatron chains one optimizer per parameter kind, e.g. experts)."""
    names = {id(p): n for n, p in engine.named_parameters()}
    return [slots(sub, names) for sub in sub_optimizers(engine.optimizer)]


def named_from_native(
    layout: Sequence[Sequence[Tuple]],
    states: Sequence[dict],
    mains: Optional[Sequence[Sequence[Optional[torch.Tensor]]]] = None,
) -> NamedState:
    """Rebuild named pieces from saved native states.

    ``layout``: per sub-optimizer, the slots' (name, shape, start, end) as recorded at save time;
    ``states``: per sub-optimizer, the inner torch optimizer's ``state_dict()``; ``mains``: per
    sub-optimizer, the main parameter of each slot where known (None: take the model weights).
    Returns {name: {"shape", "start", "end", "exp_avg", "exp_avg_sq", "step", "param"?}} with flat pieces.
    """
    out: NamedState = {}
    for sub_index, (described, state_dict) in enumerate(zip(layout, states)):
        state = state_dict["state"]
        groups = state_dict["param_groups"]
        index_step = {i: g.get("step") for g in groups for i in g["params"]}
        for index, (name, shape, start, end) in enumerate(described):
            entry = state.get(index, {})
            piece: Dict[str, Any] = {"shape": tuple(shape), "start": start, "end": end}
            for key in MOMENTS:
                if key in entry:
                    piece[key] = entry[key].detach().reshape(-1).float()
            step = entry.get("step", index_step.get(index))
            piece["step"] = None if step is None else float(step)
            main = mains[sub_index][index] if mains is not None else None
            if main is not None:
                piece["param"] = main.detach().reshape(-1).float()
            out.setdefault(name, []).append(piece)
    return out


def assemble(pieces_per_rank: Sequence[NamedState]) -> Dict[str, Dict[str, torch.Tensor]]:
    """Full (TP-local) tensors per name from the pieces of every data-parallel rank.

    Every element of a parameter must be covered, else its state is incomplete (a missing DP file):
    that raises ValueError naming the parameter.
    """
    out: Dict[str, Dict[str, Any]] = {}
    covered: Dict[str, torch.Tensor] = {}
    for named in pieces_per_rank:
        for name, pieces in named.items():
            for piece in pieces:
                numel = math.prod(piece["shape"])
                full = out.setdefault(name, {"shape": piece["shape"], "step": piece["step"]})
                mask = covered.setdefault(name, torch.zeros(numel, dtype=torch.bool))
                mask[piece["start"] : piece["end"]] = True
                for key in MOMENTS + ("param",):
                    if key in piece:
                        flat = full.setdefault(key, torch.zeros(numel, dtype=torch.float32))
                        flat[piece["start"] : piece["end"]] = piece[key]
    result = {}
    for name, full in out.items():
        if not bool(covered[name].all()):
            raise ValueError(f"the optimizer state of {name} is incomplete (a data-parallel rank's file is missing)")
        result[name] = {
            k: (v.reshape(full["shape"]) if isinstance(v, torch.Tensor) else v) for k, v in full.items() if k != "shape"
        }
    return result


@torch.no_grad()
def load_named(engine, named: Dict[str, Dict[str, Any]]) -> None:
    """Put a named state (full TP-local tensors per parameter name) into the engine's optimizer: each
    slot takes its [start, end) range; the main (fp32) weights too where the state has them."""
    for sub, sub_slots in zip(sub_optimizers(engine.optimizer), engine_slots(engine)):
        missing = [s.name for s in sub_slots if s.name not in named]
        if missing:
            raise KeyError(f"the optimizer state lacks {missing[:3]}{'...' if len(missing) > 3 else ''}")
        inner = sub.optimizer
        for slot in sub_slots:
            entry = named[slot.name]
            stored = next((entry[k] for k in MOMENTS + ("param",) if k in entry), None)
            if stored is not None and tuple(stored.shape) != tuple(slot.shape):
                raise ValueError(
                    f"{slot.name}: optimizer state of shape {tuple(stored.shape)}, the model's is {slot.shape}"
                )
            state = inner.state[slot.main]
            for key in MOMENTS:
                if key not in entry:  # saved before the optimizer's first step: nothing to restore
                    continue
                value = entry[key].reshape(-1)[slot.start : slot.end].view(slot.main.shape)
                if key in state:
                    state[key].copy_(value)
                else:
                    state[key] = value.to(device=slot.main.device, dtype=slot.main.dtype).clone()
            if entry.get("step") is not None:
                if "step" in slot.group:  # fused Adams (apex, TE) count steps per group
                    slot.group["step"] = int(entry["step"])
                else:  # torch's Adam: a float tensor per parameter
                    state["step"] = torch.tensor(float(entry["step"]), dtype=torch.float32)
            if "param" in entry:  # the model's own weights were loaded from the checkpoint already
                slot.main.copy_(entry["param"].reshape(-1)[slot.start : slot.end].view(slot.main.shape))


def describe_slots(all_slots: Sequence[Sequence[Slot]]) -> List[List[Tuple]]:
    """The ``layout`` a checkpoint records: per sub-optimizer, each slot's (name, shape, start, end)."""
    return [[slot.describe() for slot in sub] for sub in all_slots]
