"""Preprocessing throughput on GSM8K train (7,473 rows) with workers 1 and 2.

    .venv/bin/python bench/preprocess.py [--input <GSM8K train.jsonl>] [--repeats 3]

The tokenizer is a byte-level BPE (vocab 8192) trained here on the same text (no model hub);
rows/s counts the whole run: reading, templating, tokenising, writing the indexed files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=os.path.join(os.path.dirname(ROOT), "shared", "data", "gsm8k", "train.jsonl"))
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    from mindspeed_rl.demo.tiny_hf import build_tokenizer

    work = tempfile.mkdtemp(prefix="bench_pre_")
    texts = []
    with open(args.input) as fh:
        for line in fh:
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    build_tokenizer(os.path.join(work, "tok"), texts, vocab_size=8192)
    rows = len(texts) // 2
    print(f"{rows} rows from {args.input}")
    for workers in (1, 2):
        times, inner = [], []
        for r in range(args.repeats):
            t0 = time.perf_counter()
            out = subprocess.run(
                [
                    sys.executable,
                    "cli/preprocess_data.py",
                    "gsm8k",
                    f"input={args.input}",
                    f"tokenizer_name_or_path={work}/tok",
                    f"output_prefix={work}/out{workers}_{r}",
                    f"workers={workers}",
                    "--quiet",
                ],
                check=True,
                cwd=ROOT,
                capture_output=True,
                text=True,
            ).stdout
            times.append(time.perf_counter() - t0)
            inner.append(float(re.search(r"\(([\d.]+) rows/s", out).group(1)))
        med = statistics.median(times)
        print(
            f"workers {workers}: preprocessing {statistics.median(inner):,.0f} rows/s (median of {args.repeats}); "
            f"whole process incl. Python start-up {med:.2f} s = {rows / med:,.0f} rows/s"
        )


if __name__ == "__main__":
    main()
