"""Reward-model training entry point: a Bradley-Terry outcome reward model on preference pairs.

    python cli/train_rm.py --config-name rm_qwen25_7b_A3 [key=value ...]
    python cli/train_rm.py --config-name rm_tiny_cpu dry_run=true
    python cli/train_rm.py --config-name rm_tiny_cpu --check

Pairs come from cli/preprocess_data.py with a pairwise handler (configs/datasets/preference_pairs.yaml). What it
saves in ``reward_config.save`` is what a PPO run loads as ``reward_config.load`` (and cli/convert_ckpt.py
exports with ``--orm``); ``save_hf: true`` also writes the HF sequence-classifier folder beside each checkpoint.
Resume with ``reward_config.finetune=false reward_config.load=<save folder>``. The config is validated completely
before anything heavy is imported (a user error exits 2 naming the key); ``dry_run=true`` prints the plan and
exits; ``--check`` also checks the paths as a real run would.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from mindspeed_rl.accelerator.detect import forced_device_kind
from mindspeed_rl.config_cls.loader import load_rm_config
from mindspeed_rl.trainer.config_names import check_model_family
from mindspeed_rl.trainer.plan import rm_plan
from mindspeed_rl.trainer.probes import missing_paths
from mindspeed_rl.utils.cli import parse_run_args, report_user_errors, stop_on_sigterm, validated_only


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    with stop_on_sigterm():
        return run_main(argv)


def run_main(argv: Optional[Sequence[str]]) -> int:
    args = parse_run_args(argv, __doc__)
    cfg = load_rm_config(args.config_name, args.overrides, args.config_dir)
    check_model_family(cfg.reward.model, f"model.{cfg.reward.megatron.model}")
    forced_device_kind()  # MINDSPEED_RL_DEVICE names a kind (its device is checked when the run starts)
    print(rm_plan(cfg), flush=True)
    if validated_only(cfg.dry_run, args.check, missing_paths(cfg)):
        return 0
    from mindspeed_rl.trainer import rm_launch  # heavy imports only after validation

    return rm_launch.run(cfg)


if __name__ == "__main__":
    sys.exit(main())
