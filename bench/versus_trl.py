"""Our PPO iteration against TRL's, run in turns: the ratio a drifting host cannot fake.

    .venv/bin/python bench/versus_trl.py [--shape small] [--dtype bf16] [--rounds 3] [--trl-dtype fp32]
                                         [--micro-batch 32] [--set KEY=VALUE ...]

A shared CPU host changes speed by 2x within hours (docs/performance.md), so two numbers taken apart are not a
ratio. Each round runs `bench/ppo_iteration.py` (ours, its median iteration) and then `bench/trl_ppo.py` (TRL 1.12's
PPO on the same work, from `.venv-trl`; its docstring says how to install it) back to back, each in a process of its
own; the table gives every round's seconds and ratio (TRL's iteration / ours) and the median ratio. `--set` passes
config overrides to ours (e.g. `generate_config.enforce_eager=false`).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = re.compile(r"^\| timing/all \| ([0-9.]+) \|", re.M)
THEIRS = re.compile(r": iteration ([0-9.]+) s")


def seconds(command: list, pattern: re.Pattern, env) -> float:
    """The iteration seconds ``command`` prints (``pattern``'s group); where it fails or prints none, exit with the
    tail of its output."""
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    found = pattern.search(proc.stdout)
    if proc.returncode != 0 or found is None:
        sys.exit(f"{' '.join(command[1:3])} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return float(found.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="small")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16", help="ours")
    p.add_argument("--trl-dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=4, help="per run, the first a warm-up")
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override of ours")
    args = p.parse_args()
    if args.rounds < 1 or args.iterations < 2:
        p.error("--rounds must be >= 1 and --iterations >= 2 (the first iteration is a warm-up)")
    trl = os.path.join(ROOT, ".venv-trl")
    if not os.path.isdir(trl):
        sys.exit(
            "TRL is not installed beside .venv: .venv/bin/pip install --no-deps --target .venv-trl "
            "-r requirements/bench-trl.txt"
        )
    common = ["--shape", args.shape, "--iterations", str(args.iterations)]
    ours = [sys.executable, "bench/ppo_iteration.py", *common, "--dtype", args.dtype]
    ours += ["--micro-batch", str(args.micro_batch)] + [f"--set={item}" for item in args.set]
    theirs = [sys.executable, "bench/trl_ppo.py", *common, "--dtype", args.trl_dtype]
    trl_env = {**os.environ, "PYTHONPATH": trl}
    print(f"ours: {' '.join(ours[1:])}\nTRL:  {' '.join(theirs[1:])}")
    print("| round | ours | TRL | TRL / ours |\n|---|---|---|---|")
    ratios = []
    for round_ in range(1, args.rounds + 1):
        mine = seconds(ours, OURS, os.environ)
        peer = seconds(theirs, THEIRS, trl_env)
        ratios.append(peer / mine)
        print(f"| {round_} | {mine:.3f} s | {peer:.3f} s | {peer / mine:.2f}x |", flush=True)
    print(f"median TRL / ours over {args.rounds} rounds: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
