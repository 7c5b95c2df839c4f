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

import sys
from typing import Optional, Sequence

from mindspeed_rl.trainer.startup.config_names import load_run_config
from mindspeed_rl.trainer.startup.plan import batch_plan
from mindspeed_rl.trainer.startup.probes import missing_paths
from mindspeed_rl.utils.cli import parse_run_args, report_user_errors, stop_on_sigterm, validated_only


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    # SIGTERM during start-up (config, imports, Ray) stops as it does later: exit 143 with a message
    with stop_on_sigterm():
        return run_main(argv)


def run_main(argv: Optional[Sequence[str]]) -> int:
    args = parse_run_args(argv, __doc__)
    cfg = load_run_config(args.config_name, args.overrides, args.config_dir)
    print(batch_plan(cfg), flush=True)
    if validated_only(cfg.dry_run, args.check, missing_paths(cfg)):
        return 0
    from mindspeed_rl.trainer import launch  # heavy imports only after validation

    return launch.run(cfg)


if __name__ == "__main__":
    sys.exit(main())
