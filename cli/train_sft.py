"""Supervised fine-tuning entry point: a model trained on instruction data (loss on the assistant turns only), the
stage before PPO.

    python cli/train_sft.py --config-name sft_qwen25_7b_A3 [key=value ...]
    python cli/train_sft.py --config-name sft_tiny_cpu dry_run=true
    python cli/train_sft.py --config-name sft_tiny_cpu --check

Examples come from cli/preprocess_data.py with an SFT handler (configs/datasets/alpaca_instruction.yaml,
messages_instruction.yaml). What it saves in ``actor_config.save`` is what a PPO run loads as ``actor_config.load``
(``save_hf: true`` also writes the HF folder beside each checkpoint, for vLLM and cli/convert_ckpt.py). Resume with
``actor_config.finetune=false actor_config.load=<save folder>``. The config is validated completely before anything
heavy is imported (a user error exits 2 naming the key); ``dry_run=true`` prints the plan and exits; ``--check``
also checks the paths as a real run would.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from mindspeed_rl.trainer.stages.stage_entry import run_stage
from mindspeed_rl.utils.cli import report_user_errors, stop_on_sigterm


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    with stop_on_sigterm():
        return run_stage("sft", argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
