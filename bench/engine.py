"""Engine throughput and MFU on this machine: forward and training step of ~12M and ~50M models.

    .venv/bin/python bench/engine.py [--seq 256] [--batch 8] [--iters 5] [--dtype fp32|bf16]

MFU = model FLOPs of the phase / (phase time x peak), the peak being a large matmul measured in
the same run and dtype. Model FLOPs per token: 2 x N forward (6 x N for forward+backward), N the
parameters that do matmuls (all but the input embedding), plus attention 4 x layers x seq x hidden
forward (x3 for training), causal masking not discounted.
"""

from __future__ import annotations

import argparse
import time

import torch

from mindspeed_rl.config_cls import MegatronConfig, ModelConfig, RoleConfig
from mindspeed_rl.models.engine import MegatronEngine
from mindspeed_rl.utils import dist

MODELS = {
    "12M": dict(
        num_layers=6,
        hidden_size=384,
        ffn_hidden_size=1024,
        num_attention_heads=6,
        num_query_groups=2,
        padded_vocab_size=4096,
    ),
    "50M": dict(
        num_layers=10,
        hidden_size=640,
        ffn_hidden_size=1728,
        num_attention_heads=10,
        num_query_groups=2,
        padded_vocab_size=8192,
    ),
    "170M": dict(  # rollout benchmarks only (bench/rollout.py): where weight traffic starts to weigh
        num_layers=12,
        hidden_size=1024,
        ffn_hidden_size=2816,
        num_attention_heads=16,
        num_query_groups=2,
        padded_vocab_size=16384,
    ),
}


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of an n^3 matmul in ``dtype`` here (the best of ``reps``)."""
    from mindspeed_rl.accelerator.cpu import matmul_seconds

    return 2 * n**3 / matmul_seconds(dtype, n, reps)


def timed(fn, iters: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--models", default="12M,50M")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    dist.init_distributed()
    dist.init_model_parallel(seed=1)
    peak = matmul_peak(dtype)
    print(f"threads {torch.get_num_threads()}, matmul peak ({args.dtype}) {peak / 1e9:.1f} GFLOP/s")
    print("| model | params | dtype | batch x seq | forward tok/s | forward MFU | train step tok/s | train MFU |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model = ModelConfig(
            max_position_embeddings=max(1024, args.seq),
            group_query_attention=True,
            add_qkv_bias=True,
            untie_embeddings_and_output_weights=True,
            **MODELS[name],
        )
        role = RoleConfig("actor", MegatronConfig(model=name, bf16=args.dtype == "bf16", lr=1e-5), model, 1)
        engine = MegatronEngine(role, total_steps=100)
        n_params = sum(p.numel() for p in engine.unwrapped().parameters())
        matmul_params = n_params - model.padded_vocab_size * model.hidden_size
        tokens = args.batch * args.seq
        attn = 4 * model.num_layers * args.seq * model.hidden_size
        batch = {
            "input_ids": torch.randint(0, model.padded_vocab_size, (args.batch, args.seq)),
            "attention_mask": torch.ones(args.batch, args.seq, dtype=torch.long),
        }

        def loss_fn(outputs, mb):
            return -outputs["log_probs"][:, 1:].mean() / (args.batch // args.micro_batch), {}

        t_fwd = timed(lambda: engine.forward(batch, args.micro_batch), args.iters)
        t_train = timed(lambda: engine.train_step(batch, loss_fn, args.micro_batch), args.iters)
        fwd_flops = tokens * (2 * matmul_params + attn)
        train_flops = 3 * fwd_flops
        print(
            f"| {name} | {n_params / 1e6:.1f}M | {args.dtype} | {args.batch} x {args.seq} | "
            f"{tokens / t_fwd:,.0f} | {fwd_flops / t_fwd / peak:.1%} | {tokens / t_train:,.0f} | "
            f"{train_flops / t_train / peak:.1%} |",
            flush=True,
        )
    dist.destroy()


if __name__ == "__main__":
    main()
