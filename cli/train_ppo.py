"""PPO training entry point (MindSpeed-RL style).

    python cli/train_ppo.py --config-name ppo_qwen25_32b_A3 [key=value ...]
    python cli/train_ppo.py --config-name ppo_tiny_cpu dry_run=true
    python cli/train_ppo.py --config-name ppo_tiny_cpu --check

The config is validated completely before anything heavy is imported; a user error exits 2
with one message naming the key. ``dry_run=true`` validates, prints the batch plan, exits 0 (missing
files are warnings). ``--check`` validates as a real run would (missing files are errors, exit 2), prints
the batch plan and starts nothing: the launcher runs it before it starts Ray.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from mindspeed_rl.config_cls import batch_plan, missing_paths
from mindspeed_rl.trainer.config_names import load_run_config
from mindspeed_rl.utils.cli import report_user_errors, stop_on_sigterm


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config-name", required=True, help="config under configs/ (e.g. ppo_qwen25_32b_A3) or a path to a YAML file"
    )
    parser.add_argument(
        "--config-dir",
        "--config-path",
        dest="config_dir",
        default=None,
        help="folder to look the config name up in (default: the project's configs/)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config and its paths as a real run would, start nothing (exit 0 or 2)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: section.key=value")
    return parser.parse_args(argv)


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    # SIGTERM during start-up (config, imports, Ray) stops as it does later: exit 143 with a message
    with stop_on_sigterm():
        return run_main(argv)


def run_main(argv: Optional[Sequence[str]]) -> int:
    args = parse_args(argv)
    cfg = load_run_config(args.config_name, args.overrides, args.config_dir)
    print(batch_plan(cfg), flush=True)
    problems = missing_paths(cfg)
    if cfg.dry_run:
        for problem in problems:
            print(f"warning: {problem} (a real run stops here)")
        print("dry_run: the config is valid; nothing was started.")
        return 0
    if problems:
        for problem in problems[1:]:
            print(f"config error: {problem}", file=sys.stderr)
        raise problems[0]
    if args.check:
        print("check: the config and its paths are valid; nothing was started.")
        return 0
    from mindspeed_rl.trainer import launch  # heavy imports only after validation

    return launch.run(cfg)


if __name__ == "__main__":
    sys.exit(main())
