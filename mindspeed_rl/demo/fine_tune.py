"""The demo's fine-tuned models (the tool task's cold start, the judge) are made by the SFT stage itself: the
same entry point, config checks, engine and checkpoints as ``cli/train_sft.py``, run in this process."""

from __future__ import annotations

from typing import Dict


def fine_tune(config_name: str, overrides: Dict[str, object]) -> None:
    """``cli/train_sft.py --config-name <config_name>`` with ``overrides`` (key -> value); raises RuntimeError
    when the stage does not end with exit code 0."""
    from ..trainer.stages.stage_entry import run_stage

    code = run_stage("sft", ["--config-name", config_name, *(f"{k}={v}" for k, v in overrides.items())], None)
    if code:
        raise RuntimeError(f"the SFT stage ({config_name}) exited with code {code}; its console output says why")
