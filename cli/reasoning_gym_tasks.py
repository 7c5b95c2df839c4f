"""Rows of reasoning-gym's procedural tasks (offline, with their own scorers) for training or evaluation.

    python cli/reasoning_gym_tasks.py --tasks basic_arithmetic,chain_sum --size 2000 --out rg/train.jsonl
    python cli/reasoning_gym_tasks.py --tasks basic_arithmetic,chain_sum --size 200 --seed 2 --out rg/test.jsonl
    python cli/preprocess_data.py reasoning_gym input=rg/train.jsonl output_prefix=data/rg/train ...

Each row is {"question", "answer"}: the task's question, and as its answer the task's entry as JSON (name, answer,
metadata), which the ``reasoning_gym`` verifier (rl_config.verifier_function) hands to the task's own scorer. Rows
of several tasks are interleaved in order; another --seed gives other questions (a held-out set: the item seeds of
two --seed values are a million apart). A task name that
reasoning-gym does not have, or a size below 1, exits 2 naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from mindspeed_rl.datasets.reasoning_gym_rows import known_tasks_hint, rows, unknown_tasks
from mindspeed_rl.utils.cli import first_line


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", required=True, help="reasoning-gym task names, comma-separated")
    parser.add_argument("--size", type=int, required=True, help="rows per task")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True, help="the .jsonl file to write")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = unknown_tasks(tasks)
    if unknown or not tasks:
        print(
            f"error: --tasks: {', '.join(unknown) or 'none given'} not in reasoning-gym ({known_tasks_hint()})",
            file=sys.stderr,
        )
        return 2
    if args.size < 1:
        print(f"error: --size: {args.size}, at least 1", file=sys.stderr)
        return 2
    try:
        made = rows(tasks, args.size, args.seed)
    except Exception as exc:  # a task's own generator refusing its settings
        print(f"error: --tasks: reasoning-gym could not generate them: {first_line(exc)}", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    partial = args.out + ".partial"
    with open(partial, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in made)
    os.replace(partial, args.out)  # never a half-written file under the name
    print(f"{len(made)} rows of {', '.join(tasks)} (seed {args.seed}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
