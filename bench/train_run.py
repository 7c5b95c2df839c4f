"""One training run through the user's command (cli/train_ppo.py), timed, and what it wrote read back:
shared by the benches that compare runs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class TrainRun:
    stdout: str
    rows: List[dict]  # metrics.jsonl of the run, one dict per line
    wall: float  # seconds, the whole command


def train(config: str, overrides: Sequence[str], label: str, env: Optional[Dict[str, str]] = None) -> TrainRun:
    """``cli/train_ppo.py --config-name config *overrides``; a failed run ends the bench naming ``label``."""
    cmd = [sys.executable, os.path.join(ROOT, "cli", "train_ppo.py"), "--config-name", config, *overrides]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{label} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    run_dir = re.findall(r"run directory: (\S+)", proc.stdout)[-1]
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    return TrainRun(proc.stdout, rows, wall)
