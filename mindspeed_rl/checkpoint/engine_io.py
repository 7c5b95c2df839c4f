"""Save and load a MegatronEngine in the Megatron checkpoint layout (model, optimizer, RNG, state).

Every rank of the engine's world calls these together. Each (TP, PP) rank file is written by
the rank with DP rank 0 (with expert parallelism: each (TP, PP, EP) file by the EP rank's first
data-parallel replica); with the distributed optimizer every DP rank also writes its own shard. Context-
parallel ranks hold the same weights as DP replicas do and count as DP ranks here (megatron's
distributed optimizer shards over DP x CP), so a checkpoint does not depend on the CP size.
"""

from __future__ import annotations

import os
import random
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from . import lora_base, optimizer_state
from . import megatron_layout as ml


def _ranks():
    from megatron.core import parallel_state as ps

    return (
        ps.get_tensor_model_parallel_rank(),
        ps.get_pipeline_model_parallel_rank(),
        ps.get_data_parallel_rank(with_context_parallel=True),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_world_size(),
    )


def _expert_ranks():
    """(EP rank, EP size, whether this rank writes its EP rank's file)."""
    from megatron.core import parallel_state as ps

    ep = ps.get_expert_model_parallel_world_size()
    if ep == 1:
        return 0, 1, ps.get_data_parallel_rank(with_context_parallel=True) == 0
    return ps.get_expert_model_parallel_rank(), ep, ps.get_expert_data_parallel_rank() == 0


def rng_state() -> Dict[str, Any]:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "tracker": get_cuda_rng_tracker().get_states(),
    }
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, keys.tolist(), pos, has_gauss, cached)  # plain data: loads with weights_only
    except ImportError:  # pragma: no cover
        pass
    from ..accelerator import get_accelerator

    device = get_accelerator().device_rng_state()
    if device is not None:
        state["device"] = device
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    get_cuda_rng_tracker().set_states(state["tracker"])
    if "device" in state:
        from ..accelerator import get_accelerator

        get_accelerator().set_device_rng_state(state["device"])


def _optimizer_state(engine) -> Optional[Dict[str, Any]]:
    """Optimizer + scheduler state of this rank, with each position's parameter name and range (the
    ``layout``, what lets a converter split and merge it). With the distributed optimizer each DP rank
    holds its own shard (the inner torch optimizers' state and its fp32 main weights), saved to its own file."""
    opt = engine.optimizer
    if opt is None:
        return None
    all_slots = optimizer_state.engine_slots(engine)
    layout = optimizer_state.describe_slots(all_slots)
    state = {"scheduler": engine.scheduler.state_dict()}
    if engine.megatron.use_distributed_optimizer:
        state["shards"] = {
            "optimizers": [sub.optimizer.state_dict() for sub in optimizer_state.sub_optimizers(opt)],
            "layout": layout,
            "mains": [[s.main.detach().cpu().clone() for s in sub] for sub in all_slots],
        }
    else:
        models = {id(p) for p in engine.parameters()}
        state["optimizer"] = opt.state_dict()
        state["layout"] = layout
        # the fp32 copies of 16-bit weights (the same tensors as in the state dict: stored once)
        state["mains"] = [[None if id(s.main) in models else s.main for s in sub] for sub in all_slots]
    return state


def _saved_model(engine, ckpt_dir: str, iteration: int) -> Tuple[Dict[str, torch.Tensor], Optional[dict]]:
    """(the weights a checkpoint stores, its LoRA record). A LoRA run whose base came from a checkpoint stores
    only what trains, with a record of that base; otherwise every weight (a seeded base is stored too)."""
    weights = {k: v.detach().cpu() for k, v in engine.named_weights()}
    if engine.lora is None:
        return weights, None
    if (
        engine.lora_base is None
        or engine.lora_base["path"] == os.path.abspath(ckpt_dir)
        and str(engine.lora_base["iteration"]) == str(iteration)
    ):  # (saving over the base's own iteration folder: it must keep the base)
        return weights, engine.lora.describe()
    trainable = set(engine.trainable_names())
    return {k: v for k, v in weights.items() if k in trainable}, dict(engine.lora.describe(), base=engine.lora_base)


def _dp_file(dp_rank: int) -> str:
    return f"distrib_optim_dp{dp_rank:03d}.pt"


def save_engine(
    engine,
    ckpt_dir: str,
    iteration: int,
    extra: Optional[Dict[str, Any]] = None,
    save_optim: bool = True,
    save_rng: bool = True,
) -> None:
    """Write ``iteration`` of this engine under ``ckpt_dir`` (atomic: staged, renamed, tracker last)."""
    from .convert import checkpoint_config

    tp_rank, pp_rank, dp_rank, tp, pp = _ranks()
    ep_rank, ep, writer = _expert_ranks()
    if not engine.all_finite():  # every rank agrees: nothing is written, the previous checkpoint stays the latest
        raise ml.CheckpointError(
            f"{ckpt_dir}: iteration {iteration} not saved: the {engine.role.name}'s weights hold NaN or Inf"
        )
    world_rank = dist.get_rank()
    if world_rank == 0:
        ml.begin_save(ckpt_dir, iteration)
    dist.barrier()
    optim = _optimizer_state(engine) if save_optim else None
    if writer:
        m = engine.megatron
        layers = m.stage_layers(engine.role.model.num_layers)
        model, lora = _saved_model(engine, ckpt_dir, iteration)
        payload = {
            "model": model,
            "iteration": iteration,
            "config": checkpoint_config(
                engine.role.model,
                tp,
                pp,
                layers,
                "bf16" if m.bf16 else "fp16" if m.fp16 else "fp32",
                engine.head == "value",
                ep,
                lora,
            ),
            **(extra or {}),
        }
        if optim is not None:
            payload["optimizer"] = {k: v for k, v in optim.items() if k != "shards"}
        if save_rng:
            payload["rng_state"] = rng_state()
        ml.write_rank(ckpt_dir, iteration, tp_rank, pp_rank, pp, payload, ep_rank, ep)
    if optim is not None and "shards" in optim:
        ml.write_extra(ckpt_dir, iteration, tp_rank, pp_rank, pp, _dp_file(dp_rank), optim["shards"], ep_rank, ep)
    dist.barrier()
    if world_rank == 0:
        sharded = optim is not None and "shards" in optim
        dp = dist.get_world_size() // (tp * pp)
        ml.commit_save(ckpt_dir, iteration, tp * pp * ep + (tp * pp * dp if sharded else 0))
    dist.barrier()


def save_hf_copy(engine, ckpt_dir: str, iteration: int) -> Optional[str]:
    """With ``save_hf``: rank 0 writes the just-saved iteration as a HF folder beside it (the converter's
    code; the --orm form for a value head) while the other ranks wait. Returns its path, or None."""
    m = engine.megatron
    if not m.save_hf:
        return None
    path = None
    if dist.get_rank() == 0:
        from .convert import export_saved_iteration

        path = export_saved_iteration(ckpt_dir, iteration, m.tokenizer_name_or_path)
    dist.barrier()
    from .convert import hf_folder_of

    return path or hf_folder_of(ckpt_dir, iteration)


def load_engine(
    engine, ckpt_dir: str, load_optim: bool = True, load_rng: bool = True, iteration: Optional[int] = None
) -> Dict[str, Any]:
    """Load the latest checkpoint (or ``iteration``) into the engine; returns the payload (iteration, extras)."""
    tp_rank, pp_rank, dp_rank, tp, pp = _ranks()
    ep_rank, ep, _ = _expert_ranks()
    iteration = ml.latest_iteration_dir(ckpt_dir, iteration)[0]  # resolved once: the folder read is the one recorded
    payload = ml.load_rank(
        ckpt_dir, tp_rank, pp_rank, expected=(tp, pp, ep), mmap=False, ep_rank=ep_rank, iteration=iteration
    )
    base_dir = engine.megatron.lora_base_load
    payload = lora_base.complete(payload, ml.rank_dir_name(tp_rank, pp_rank, pp, ep_rank, ep), ckpt_dir, base_dir)
    stored_lora = (payload.get("config") or {}).get("lora")
    own_lora = engine.lora.describe() if getattr(engine, "lora", None) is not None else None
    if stored_lora and own_lora and (stored_lora["r"], stored_lora["alpha"]) != (own_lora["r"], own_lora["alpha"]):
        raise ml.CheckpointError(
            f"{ckpt_dir}: saved with LoRA r={stored_lora['r']} alpha={stored_lora['alpha']}, the run has "
            f"r={own_lora['r']} alpha={own_lora['alpha']}: use the checkpoint's settings"
        )
    if own_lora and not stored_lora and load_optim:
        raise ml.CheckpointError(
            f"{ckpt_dir}: holds no LoRA adapters, so a LoRA run cannot resume from it; start from it with "
            "finetune: true (the adapters begin as initialised)"
        )
    try:
        engine.load_weights(payload["model"])
    except (KeyError, ValueError) as exc:
        raise ml.CheckpointError(f"{ckpt_dir}: {str(exc).strip(chr(39))}") from None
    if own_lora:  # where the frozen base lives from now on: what adapter-only saves point at
        recorded = lora_base.base_of(payload)
        if recorded is None:
            # the frozen tensors as the file holds them (the run may hold them in another dtype)
            frozen = {n for n, _ in engine.named_weights()} - set(engine.trainable_names())
            base = lora_base.origin(ckpt_dir, iteration)
            base["fingerprint"] = lora_base.fingerprint((n, t) for n, t in payload["model"].items() if n in frozen)
            engine.lora_base = base
        else:
            engine.lora_base = dict(recorded, path=os.path.abspath(base_dir or recorded["path"]))
    if load_optim and engine.optimizer is not None:
        optim = payload.get("optimizer")
        if optim is None:
            raise ml.CheckpointError(f"{ckpt_dir}: has no optimizer state; set no_load_optim: true to start it fresh")
        engine.scheduler.load_state_dict(optim["scheduler"])
        if "named" in optim:  # resharded by the converter: by parameter name, any optimizer layout
            try:
                optimizer_state.load_named(engine, optim["named"])
            except (KeyError, ValueError) as exc:
                raise ml.CheckpointError(f"{ckpt_dir}: {str(exc).strip(chr(39))}") from None
        elif engine.megatron.use_distributed_optimizer:
            saved = ml.load_extra(ckpt_dir, tp_rank, pp_rank, _dp_file(dp_rank), ep_rank, iteration)
            all_slots = optimizer_state.engine_slots(engine)
            if isinstance(saved, dict) and _plain(saved["layout"]) != _plain(optimizer_state.describe_slots(all_slots)):
                raise ml.CheckpointError(
                    f"{ckpt_dir}: the distributed optimizer's shards were saved for another split of the parameters "
                    "(another data-parallel size or other LoRA settings); reshard the checkpoint with "
                    "cli/convert_ckpt.py --load-model-type mg --save-model-type mg (it loads at any DP size), or "
                    "set no_load_optim: true"
                )
            shards = saved["optimizers"] if isinstance(saved, dict) else saved
            for sub, state in zip(optimizer_state.sub_optimizers(engine.optimizer), shards):
                sub.optimizer.load_state_dict(state)
            if isinstance(saved, dict):  # the fp32 main weights (older checkpoints: rebuilt from the weights)
                for sub_slots, mains in zip(all_slots, saved["mains"]):
                    for slot, main in zip(sub_slots, mains):
                        slot.main.data.copy_(main)
        elif "optimizer" in optim:
            engine.optimizer.load_state_dict(optim["optimizer"])
        else:
            raise ml.CheckpointError(
                f"{ckpt_dir}: saved with the distributed optimizer; set "
                "use_distributed_optimizer: true or no_load_optim: true"
            )
    if load_rng and payload.get("rng_state") is not None:
        set_rng_state(payload["rng_state"])
    return payload


def _plain(layout) -> list:
    """A recorded optimizer layout as plain lists (tuples and lists compare equal)."""
    return [[[name, list(shape), start, end] for name, shape, start, end in sub] for sub in layout]


def load_weights_only(engine, ckpt_dir: str) -> Dict[str, Any]:
    """finetune: weights from the latest (or release) checkpoint, nothing else."""
    return load_engine(engine, ckpt_dir, load_optim=False, load_rng=False)
