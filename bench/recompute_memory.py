"""Activation memory a training step keeps for its backward, per recomputation setting, and the step time.

    .venv/bin/python bench/recompute_memory.py [--model 12M] [--seq 512] [--batch 4] [--iters 3]

The memory is counted exactly and on any device: the storages of every tensor autograd saved during the forward
(``torch.autograd.graph.saved_tensors_hooks``), weights excluded, as they stand when the backward starts.
Recomputed parts run without saving their insides, so the count drops by what they would have kept. One
micro-batch per step.
"""

from __future__ import annotations

import argparse
import time
from typing import Dict, List, Tuple

import torch

from bench.engine import MODELS
from mindspeed_rl.config_cls import MegatronConfig, ModelConfig, RoleConfig
from mindspeed_rl.models.engine import MegatronEngine
from mindspeed_rl.utils import dist

SETTINGS: List[Tuple[str, Dict]] = [
    ("none", {}),
    ("recompute_norm (megatron-core layernorm)", {"recompute_norm": True}),
    ("selective core_attn", {"recompute_granularity": "selective"}),
    ("selective core_attn + layernorm", {"recompute_granularity": "selective", "recompute_norm": True}),
    ("selective mlp", {"recompute_granularity": "selective", "recompute_modules": ["mlp"]}),
    (
        "full, uniform 1 layer",
        {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    ),
]


def saved_activation_bytes(engine: MegatronEngine, batch, loss_fn) -> Tuple[int, float]:
    """(bytes of the activations one training step holds for its backward when the backward starts, seconds of
    the step). Storages are read at the first unpack: what recomputation freed after saving (megatron-core's
    CheckpointWithoutOutput empties a norm's output once the next layer has used it) counts as freed."""
    weights = {p.untyped_storage().data_ptr() for p in engine.parameters()}
    saved: Dict[int, torch.Tensor] = {}
    held: List[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        ptr = tensor.untyped_storage().data_ptr()
        if not held and ptr not in weights:  # the forward's (the backward's recomputation comes after)
            saved.setdefault(ptr, tensor)
        return tensor

    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        if not held:
            held.append(sum(t.untyped_storage().nbytes() for t in saved.values()))
        return tensor

    rows = batch["input_ids"].shape[0]
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        engine.train_step(batch, loss_fn, rows)  # one micro-batch: one forward, then its backward
    seconds = time.perf_counter() - start
    saved.clear()
    return held[0], seconds


def role(model: ModelConfig, name: str, **recompute) -> RoleConfig:
    return RoleConfig("actor", MegatronConfig(model=name, lr=1e-5, **recompute), model, 1)


def measure(model: ModelConfig, name: str, batch, iters: int) -> List[Tuple[str, int, float]]:
    """(setting, saved bytes, best step seconds) of each setting, from the same initial weights."""

    def loss_fn(outputs, mb):
        return -outputs["log_probs"][:, 1:].mean(), {}

    rows, initial = [], None
    for label, recompute in SETTINGS:
        engine = MegatronEngine(role(model, name, **recompute), total_steps=100)
        if initial is None:
            initial = {k: v.clone() for k, v in engine.named_weights()}
        engine.load_weights(initial)
        results = [saved_activation_bytes(engine, batch, loss_fn) for _ in range(iters)]
        rows.append((label, results[-1][0], min(seconds for _, seconds in results)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="12M", choices=sorted(MODELS))
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    dist.init_distributed()
    dist.init_model_parallel(seed=1)
    model = ModelConfig(max_position_embeddings=max(1024, args.seq), group_query_attention=True, **MODELS[args.model])
    batch = {
        "input_ids": torch.randint(0, model.padded_vocab_size, (args.batch, args.seq)),
        "attention_mask": torch.ones(args.batch, args.seq, dtype=torch.long),
    }
    rows = measure(model, args.model, batch, args.iters)
    base = rows[0][1]
    print(f"{args.model}, batch {args.batch} x seq {args.seq}, fp32, {torch.get_num_threads()} threads")
    print("| setting | activations kept for the backward | vs none | step time |")
    print("|---|---|---|---|")
    for label, saved, seconds in rows:
        print(f"| {label} | {saved / 2**20:.1f} MiB | {saved / base - 1:+.1%} | {seconds:.2f} s |")
    dist.destroy()


if __name__ == "__main__":
    main()
