"""What this host's CPU does with bf16: the accelerator's answer to ``bf16: auto`` and the matmul rates behind it.

    .venv/bin/python bench/precision.py [--size 1024]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        .venv/bin/python bench/precision.py   # as an AVX2-only CPU

Prints torch's capability, oneDNN's bf16 answer, the decision and its reason, fp32 and bf16 GFLOP/s of a size^3
matmul (best of a few, in this process), and the slowdown probe the warning of a set bf16 quotes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args(argv)
    import torch

    from bench.engine import matmul_peak
    from mindspeed_rl.accelerator.cpu import CpuAccelerator, cpu_bf16_facts

    capability, onednn, units = cpu_bf16_facts()
    host = CpuAccelerator().host_precision()
    start = time.perf_counter()
    slowdown = CpuAccelerator().bf16_slowdown()
    probe = time.perf_counter() - start
    fp32, bf16 = (matmul_peak(dtype, args.size, reps=3) / 1e9 for dtype in (torch.float32, torch.bfloat16))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"ATen capability {capability}; oneDNN bf16 {onednn}; bf16 instructions {', '.join(units) or 'none'}")
    print(f"bf16: auto -> {'bf16' if host.native_bf16 else 'fp32'} ({host.why})")
    print(f"{args.size}^3 matmul: fp32 {fp32:.1f} GFLOP/s, bf16 {bf16:.1f} GFLOP/s (bf16 / fp32 = {bf16 / fp32:.3f})")
    print(f"slowdown probe (256^3, the warning's figure): {slowdown:.1f}x in {probe:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
