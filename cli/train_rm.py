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

from mindspeed_rl.trainer.stages.stage_entry import run_stage
from mindspeed_rl.utils.cli import report_user_errors, stop_on_sigterm


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    with stop_on_sigterm():
        return run_stage("rm", argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
