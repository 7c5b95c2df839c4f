"""One decode step's weight products at a bench shape, through each CPU GEMM route, against the step's floors.

    .venv/bin/python bench/decode_products.py [--shape small] [--rows 32] [--threads 2] [--repeats 30]

A decode step multiplies `--rows` tokens (one per running sequence) by every weight of the model: per layer the
fused QKV, the attention output, the fused gate-up and the down projection, then the LM head
(`bench/ppo_iteration.py`'s shapes, its `matmul_shapes`). The routes: torch's `F.linear` (MKL on x86), vLLM's CPU
route (oneDNN with the weight packed once, `create_onednn_mm`) and MKL's packed GEMM (`_mkl_reorder_linear_weight`).
Floors: the step's FLOPs at a 2048^3 fp32 product's speed measured here (`bench/engine.py`'s `matmul_peak`), and its
weights' bytes at the speed a large copy reads memory here. All fp32; the printed error is each route's largest
difference from `F.linear`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.engine import matmul_peak  # noqa: E402
from bench.ppo_iteration import SHAPES, matmul_shapes  # noqa: E402


def seconds(calls: Sequence[Callable[[], torch.Tensor]], repeats: int) -> float:
    """Best of ``repeats`` steps, each every call once."""
    for call in calls:
        call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--rows", type=int, default=32, help="sequences decoding together")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = [torch.randn(out, inp) * 0.02 for out, inp in matmul_shapes(SHAPES[args.shape], "lm")]
    xs = [torch.randn(args.rows, w.shape[1]) for w in weights]
    flops = sum(2 * args.rows * w.numel() for w in weights)
    wbytes = sum(w.numel() * 4 for w in weights)

    peak = matmul_peak(torch.float32)
    stream = torch.randn(64 * 2**20)
    read = stream.numel() * 4 / seconds([lambda: stream.sum()], 5)
    print(
        f"shape {args.shape}: {len(weights)} products, {wbytes / 1e6:.1f} MB of fp32 weights, {args.rows} rows, "
        f"{args.threads} threads; fp32 peak {peak / 1e9:.0f} GFLOP/s, memory read {read / 1e9:.1f} GB/s"
    )
    floors = f"FLOPs at the peak {flops / peak * 1e3:.2f} ms, weights at the read speed {wbytes / read * 1e3:.2f} ms"
    print(f"floors: {floors}")

    reference = [F.linear(x, w) for x, w in zip(xs, weights)]
    routes = {"F.linear": [lambda x=x, w=w: F.linear(x, w) for x, w in zip(xs, weights)]}
    try:
        from vllm import _custom_ops as ops

        handlers = [ops.create_onednn_mm(w.t(), 32) for w in weights]
        routes["vLLM oneDNN (prepacked)"] = [lambda x=x, h=h: ops.onednn_mm(h, x, None) for x, h in zip(xs, handlers)]
    except (ImportError, AttributeError, RuntimeError) as e:
        print(f"vLLM's oneDNN route unavailable: {e}")
    if torch.backends.mkl.is_available():
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, args.rows) for w in weights]
        routes["MKL packed"] = [
            lambda x=x, p=p, w=w: torch.ops.mkl._mkl_linear(x, p, w, None, args.rows)
            for x, p, w in zip(xs, packed, weights)
        ]
    print("| route | step | GFLOP/s | x FLOPs floor | max error |")
    print("|---|---|---|---|---|")
    for name, calls in routes.items():
        t = seconds(calls, args.repeats)
        err = max((call() - ref).abs().max().item() for call, ref in zip(calls, reference))
        print(f"| {name} | {t * 1e3:.2f} ms | {flops / t / 1e9:.0f} | {t * peak / flops:.2f} | {err:.1e} |")


if __name__ == "__main__":
    main()
