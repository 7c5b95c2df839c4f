"""Preference optimisation entry point: DPO (sigmoid loss, with label smoothing), IPO or SimPO on preference pairs,
the policy against the frozen starting model.

    python cli/train_dpo.py --config-name dpo_qwen25_7b_A3 [key=value ...]
    python cli/train_dpo.py --config-name dpo_tiny_cpu dry_run=true
    python cli/train_dpo.py --config-name dpo_tiny_cpu --check

Pairs come from cli/preprocess_data.py with the pairwise handler (configs/datasets/preference_pairs.yaml), as for
reward-model training. The reference is the model ``actor_config.load`` holds at the start (``dpo_config.ref_model``
names another; with LoRA it is the base model, adapters off; SimPO has none). What it saves in ``actor_config.save``
is what a PPO run loads as ``actor_config.load``. Resume with ``actor_config.finetune=false
actor_config.load=<save folder>``: the reference is the same starting model. The config is validated completely
before anything heavy is imported (a user error exits 2 naming the key); ``dry_run=true`` prints the plan and exits;
``--check`` also checks the paths as a real run would.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from mindspeed_rl.trainer.stages.stage_entry import run_stage
from mindspeed_rl.utils.cli import report_user_errors, stop_on_sigterm


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    with stop_on_sigterm():
        return run_stage("dpo", argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
