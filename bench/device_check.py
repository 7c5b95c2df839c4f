"""Our engine on one device, proved and measured in a few minutes: the GPU check for an air-gapped node.

    python3 bench/device_check.py --out RESULTS [--smoke] [--steps environment,parity,...] [--minutes 9]

Steps, in this order so that an early stop still leaves results (each one's numbers are written to
RESULTS/device_check.json and RESULTS/device_check.md as soon as it ends; a failing step is recorded with its
error and the next one runs):

  environment  device name and memory, driver, torch / CUDA, the versions in use; a bf16 matmul's TFLOP/s
  parity       a Qwen2.5-0.5B-shaped model (random init) built by our builder, in fp32 and bf16, against
               transformers' own model holding the same weights: the largest log-prob difference
  training     our engine's forward + backward + optimizer step (bf16): tokens/s, MFU against the device's
               bf16 peak and peak memory, for 0.5B and 1.5B shapes x two sequence lengths x padded / packed
               (use_remove_padding) x without / with full recomputation
  head         the chunked log-prob head against the plain one (whole-vocabulary logits) at 8K and 32K tokens
               of Qwen's 151,936-word vocabulary, forward + backward: peak memory and time
  algorithms   every registered advantage estimator, policy loss and KL form on the device against the CPU
               (fp32): the largest difference
  generation   the megatron-core fallback rollout engine (no vLLM) sampling from the 0.5B shape: tokens/s
  profile      torch.profiler over two training steps of the 0.5B shape (1K, packed): the step's wall time
               against the device's busy time, and the operators that take the most device time
  fused_kernels liger-kernel's RMSNorm, SwiGLU and RoPE (use_fused_rmsnorm, use_fused_swiglu,
               use_fused_rotary_pos_emb) against torch's on the same weights: log-prob, loss and gradient-norm
               differences in fp32 and bf16, then the training step of the first shape at 4K packed with each
               (skipped where liger-kernel is absent)
  training_7b  Qwen2.5-7B's widths (hidden 3584, 28 / 4 heads, MLP 18944, vocabulary 152,064, untied) with as
               many layers as fit the device with Adam (at most 8), 4K rows packed and split by a token budget
               of 16,384 (dynamic batch size), bf16: tokens/s, MFU, peak memory; with torch's modules, then
               with liger-kernel's where it is installed
  profile_7b   torch.profiler over one step of the 7B-shaped row (liger-kernel's kernels where installed)

`--smoke` runs every step at toy sizes on whatever device there is (the test suite runs it on CPU). Steps stop
starting once `--minutes` are spent; those left are recorded as skipped. MFU counts model FLOPs of the real
(non-padding) tokens only, whatever the layout computes: 6 x N per token (N the weights that do matmuls, the
LM head included, the input embedding not) plus 12 x layers x hidden x the row's length for attention (the
causal mask not discounted), over the device's dense bf16 peak (measured matmul where the device is unknown).
Recomputation's extra forward is not counted (model FLOPs, not hardware FLOPs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import device_algorithms, device_kernels, device_steps, device_training  # noqa: E402

STEP_FUNCTIONS: Dict[str, Callable] = {  # in the order they run
    "environment": device_steps.step_environment,
    "parity": device_steps.step_parity,
    "training": device_training.training_rows,
    "head": device_training.head_rows,
    "algorithms": device_algorithms.algorithm_rows,
    "generation": device_steps.step_generation,
    "profile": device_training.profile_rows,
    "fused_kernels": device_kernels.kernel_rows,
    "training_7b": device_training.wide_rows,  # late: the earlier rows stay comparable with older runs
    "profile_7b": device_training.wide_profile_rows,
}
STEPS = tuple(STEP_FUNCTIONS)


class Results:
    """Every step's record, rewritten to RESULTS/device_check.json and .md after each step."""

    def __init__(self, folder: str, argv: Sequence[str]):
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.data: Dict = {"command": " ".join(["bench/device_check.py", *argv]), "steps": {}}

    def record(self, step: str, status: str, seconds: float, result=None, error: Optional[str] = None) -> None:
        self.data["steps"][step] = {"status": status, "seconds": round(seconds, 1), "result": result, "error": error}
        with open(os.path.join(self.folder, "device_check.json"), "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1)
        with open(os.path.join(self.folder, "device_check.md"), "w", encoding="utf-8") as f:
            f.write(self.markdown())

    def markdown(self) -> str:
        lines = [f"`{self.data['command']}`", ""]
        for step, rec in self.data["steps"].items():
            lines.append(f"### {step}: {rec['status']} ({rec['seconds']} s)")
            lines.append("")
            if rec["error"]:
                lines += ["```", rec["error"].rstrip(), "```"]
            elif rec["result"] is not None:
                lines += table(rec["result"])
            lines.append("")
        return "\n".join(lines)


def table(result) -> List[str]:
    """A list of rows as a markdown table; a dict as key | value rows."""
    rows = result if isinstance(result, list) else [{"what": k, "value": v} for k, v in result.items()]
    if not rows:
        return ["(nothing)"]
    keys = list(dict.fromkeys(k for row in rows for k in row))
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(cell(row.get(k, "")) for k in keys) + " |" for row in rows]
    return out


def cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def run_steps(steps: Sequence[str], ctx: "device_steps.Context", results: Results, deadline: float) -> int:
    """Run ``steps`` in order, each recorded when it ends; returns the number that failed."""
    failed = 0
    for step in steps:
        if time.monotonic() > deadline:
            results.record(step, "skipped", 0.0, error="out of time (--minutes)")
            print(f"[device_check] {step}: skipped, out of time", flush=True)
            continue
        ctx.deadline = deadline
        start = time.monotonic()
        try:
            result = STEP_FUNCTIONS[step](ctx)
        except Exception as exc:  # recorded and reported; the next step still runs
            failed += 1
            tail = "".join(traceback.format_exception(exc)[-6:])
            results.record(step, "failed", time.monotonic() - start, error=tail)
            print(f"[device_check] {step}: FAILED {type(exc).__name__}: {exc}", flush=True)
            ctx.release()
            continue
        status = "failed" if isinstance(result, list) and any(r.get("ok") is False for r in result) else "ok"
        failed += status == "failed"
        results.record(step, status, time.monotonic() - start, result)
        print(f"[device_check] {step}: {status} ({time.monotonic() - start:.1f} s)", flush=True)
        print("\n".join(table(result)), flush=True)
        ctx.release()
    return failed


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results folder (device_check.json, device_check.md)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes: proves the script, measures nothing")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    parser.add_argument("--minutes", type=float, default=9.0, help="no step starts after this many minutes")
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        print(f"error: --steps: unknown {unknown}; choose from {', '.join(STEPS)}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + 60 * args.minutes
    results = Results(args.out, argv)
    ctx = device_steps.Context(smoke=args.smoke)
    try:
        failed = run_steps(steps, ctx, results, deadline)
    finally:
        ctx.close()
    passed = sum(r["status"] == "ok" for r in results.data["steps"].values())
    print(f"[device_check] {passed} of {len(steps)} steps passed; results in {args.out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
