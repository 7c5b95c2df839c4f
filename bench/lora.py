"""LoRA vs full-parameter training of the ~50M engine shape: peak host memory, step time, weight stream,
checkpoint size.

    .venv/bin/python bench/lora.py [--model 50M] [--r 16] [--seq 256] [--batch 8] [--iters 5] [--dtype bf16]

Each variant runs in its own process (peak RSS is per process): build the engine (with its reference
model for full-parameter training, as the actor worker does; LoRA needs none), take training steps,
stream the weights the rollout receives (``iter_full_weights``, what resharding to vLLM reads; merged for
LoRA), then save a checkpoint (LoRA: started from a base checkpoint, so it holds the adapters and their
optimizer state only). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VARIANTS = ("full", "lora")


def run_variant(args) -> dict:
    import torch

    from bench.engine import MODELS
    from mindspeed_rl.checkpoint.engine_io import load_weights_only, save_engine
    from mindspeed_rl.config_cls import MegatronConfig, ModelConfig, RoleConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights
    from mindspeed_rl.utils import dist

    dist.init_distributed()
    dist.init_model_parallel(seed=1)
    model = ModelConfig(max_position_embeddings=max(1024, args.seq), group_query_attention=True, add_qkv_bias=True,
                        untie_embeddings_and_output_weights=True, **MODELS[args.model])  # fmt: skip
    lora = {"lora_r": args.r, "lora_alpha": 2.0 * args.r} if args.variant == "lora" else {}
    megatron = MegatronConfig(model=args.model, bf16=args.dtype == "bf16", lr=1e-5, **lora)
    role = RoleConfig("actor", megatron, model, 1)
    actor = MegatronEngine(role, total_steps=100)
    reference = MegatronEngine(role, trainable=False) if args.variant == "full" else None
    trainable = sum(p.numel() for p in actor.unwrapped().parameters() if p.requires_grad)
    batch = {"input_ids": torch.randint(0, model.padded_vocab_size, (args.batch, args.seq)),
             "attention_mask": torch.ones(args.batch, args.seq, dtype=torch.long)}  # fmt: skip

    def loss_fn(outputs, mb):
        return -outputs["log_probs"][:, 1:].mean() / (args.batch // args.micro_batch), {}

    scratch = tempfile.mkdtemp(prefix="bench_lora_")
    if args.variant == "lora":  # the base comes from a checkpoint, as in a run: its saves hold the adapters only
        save_engine(actor, os.path.join(scratch, "base"), 0)
        load_weights_only(actor, os.path.join(scratch, "base"))
    actor.train_step(batch, loss_fn, args.micro_batch)  # warm-up (and Adam's state)
    t0 = time.perf_counter()
    for _ in range(args.iters):
        actor.train_step(batch, loss_fn, args.micro_batch)
    step = (time.perf_counter() - t0) / args.iters
    t0 = time.perf_counter()  # the rollout's weight stream (resharding to vLLM reads it), merged for LoRA
    exported = sum(t.numel() for piece in iter_full_weights(actor) for t in piece.values())
    export = time.perf_counter() - t0
    del reference
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # before the checkpoint's buffers
    t0 = time.perf_counter()
    save_engine(actor, os.path.join(scratch, "ckpt"), 1)
    save_s = time.perf_counter() - t0
    folder = os.path.join(scratch, "ckpt")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)
    shutil.rmtree(scratch)
    return {"variant": args.variant, "trainable": trainable, "exported": exported, "step_s": step,
            "export_s": export, "peak_rss_gib": peak, "ckpt_mb": size / 1e6, "save_s": save_s}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="50M")
    parser.add_argument("--r", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--variant", choices=VARIANTS, default=None, help="(internal) run one variant")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    rows = []
    for variant in VARIANTS:
        argv = [sys.executable, __file__, "--variant", variant] + sys.argv[1:]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"model {args.model}, {args.dtype}, batch {args.batch} x {args.seq}, LoRA r={args.r} on every target")
    print("| variant | trainable params | peak host memory | train step | weight stream (to rollout) | checkpoint |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['trainable'] / 1e6:.2f}M | {r['peak_rss_gib']:.2f} GiB | {r['step_s']:.2f} s "
              f"| {r['export_s'] * 1e3:.0f} ms ({r['exported'] / 1e6:.1f}M values) "
              f"| {r['ckpt_mb']:.1f} MB in {r['save_s']:.2f} s |")  # fmt: skip


if __name__ == "__main__":
    main()
