"""Adapter-only LoRA checkpoints: a LoRA run saves what trains (adapters, a critic's value head) and its
optimizer state; the frozen base stays in the checkpoint the run started from.

Each rank file of such a checkpoint records in ``config["lora"]["base"]``:

    {"path": the base checkpoint folder, "iteration": its iteration folder,
     "fingerprint": {tensor name: "sha256:<hex digest of its dtype, shape and bytes>"}}

with the fingerprint taken over this rank's frozen tensors as the base's rank file holds them (its dtype,
whatever the run trains in). Reading the checkpoint (resume, finetune, conversion, resharding) completes each
rank file with the same rank file of the base and checks the fingerprint, so adapters are never combined with
weights other than those they were trained on. Checkpoints written before the digest recorded
[sum, sum of squares] per tensor: they are still read with that weaker check, and the completed payload
carries the digests, so a run resumed from one records them from its next save on.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

import torch

from . import megatron_layout as ml


def tensor_digest(tensor: torch.Tensor) -> str:
    """The tensor's "sha256:<hex>" over its dtype, shape and bytes: any change of a value, of its place, of the
    shape or the dtype changes it (about 0.15 s for the 50M shape's 214 MB fp32 rank file)."""
    t = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy())
    return f"sha256:{digest.hexdigest()}"


def fingerprint(tensors: Iterable[Tuple[str, torch.Tensor]]) -> Dict[str, str]:
    """Per tensor name its digest (tensor_digest)."""
    return {name: tensor_digest(tensor) for name, tensor in tensors}


def _legacy_sums(tensor: torch.Tensor) -> list:
    """The fingerprint of checkpoints written before the digest: [sum, sum of squares] in float64."""
    t = tensor.detach().to(torch.float64)
    return [float(t.sum()), float(t.square().sum())]


def _differs(recorded: Union[str, list], tensor: torch.Tensor, digest: str) -> bool:
    if isinstance(recorded, str):
        return recorded != digest
    found = _legacy_sums(tensor)
    return len(recorded) != 2 or any(
        not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) for x, y in zip(found, recorded)
    )


def base_of(payload: Mapping[str, Any]) -> Optional[dict]:
    """The base record of an adapter-only rank file (None: the file holds the whole model)."""
    return ((payload.get("config") or {}).get("lora") or {}).get("base")


def origin(ckpt_dir: str, iteration: Optional[int] = None) -> dict:
    """The record of a base checkpoint folder (its absolute path and the iteration folder read)."""
    resolved, _ = ml.latest_iteration_dir(ckpt_dir, iteration)
    return {"path": os.path.abspath(ckpt_dir), "iteration": resolved}


def _hint(base_dir: Optional[str]) -> str:
    return (
        "check lora_base_load"
        if base_dir
        else "restore it there (a training run can name its new folder in lora_base_load)"
    )


def missing_base(payload: Mapping[str, Any], base_dir: Optional[str] = None) -> Optional[str]:
    """Why an adapter-only rank file cannot be completed because its base folder is gone (None: it can be
    read, or the file holds the whole model). Cheap: for checks before anything heavy starts."""
    base = base_of(payload)
    folder = base_dir or (base or {}).get("path")
    if base is None or ml.read_tracker_or_none(folder) is not None:
        return None
    return f"holds LoRA adapters only; their base checkpoint {folder} is missing or empty: {_hint(base_dir)}"


def complete(payload: Dict[str, Any], rank_dir: str, where: str, base_dir: Optional[str] = None) -> Dict[str, Any]:
    """``payload`` (one rank file, read from folder ``where``) with its whole model: an adapter-only file's
    frozen tensors are read from the same rank file of its base checkpoint (``base_dir`` overrides the
    recorded folder) and checked against the recorded fingerprint. A whole-model file is returned as is."""
    base = base_of(payload)
    if base is None:
        return payload
    folder, hint = base_dir or base["path"], _hint(base_dir)
    missing = missing_base(payload, base_dir)
    if missing:
        raise ml.CheckpointError(f"{where}: {missing}")
    try:
        _, iter_dir = ml.latest_iteration_dir(folder, base["iteration"])
    except ml.CheckpointError as exc:
        raise ml.CheckpointError(f"{where}: the adapters' base {folder}: {exc}") from None
    path = os.path.join(iter_dir, rank_dir, ml.FILE)
    if not os.path.isfile(path):
        raise ml.CheckpointError(
            f"{where}: the adapters' base {iter_dir} has no {rank_dir} (saved at another TP/PP/EP layout); "
            "the base must have the adapters' layout"
        )
    model = payload["model"]
    frozen = {n: t for n, t in ml.safe_load(path, mmap=True)["model"].items() if n not in model}
    recorded = base["fingerprint"]
    missing = sorted(set(recorded) - set(frozen))
    if missing:
        raise ml.CheckpointError(f"{where}: the adapters' base {iter_dir} lacks {missing[:3]}")
    found = fingerprint((n, frozen[n]) for n in recorded)
    changed = [n for n in recorded if _differs(recorded[n], frozen[n], found[n])]
    if changed:
        raise ml.CheckpointError(
            f"{where}: the adapters were trained on another base than {iter_dir} ({changed[0]} differs"
            f"{f' and {len(changed) - 1} more' if len(changed) > 1 else ''}); {hint}"
        )
    config = payload["config"]
    lora = dict(config["lora"], base=dict(base, fingerprint=found))  # a legacy record gets the digests
    return dict(payload, model={**{n: frozen[n] for n in recorded}, **model}, config=dict(config, lora=lora))
