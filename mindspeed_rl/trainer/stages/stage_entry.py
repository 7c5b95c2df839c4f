"""What cli/train_rm.py and cli/train_sft.py do: validate the config completely (a user error exits 2 naming the
key), print the plan, stop there for ``dry_run`` / ``--check``, and only then import the heavy stack and train."""

from __future__ import annotations

from typing import Optional, Sequence

from ...accelerator.detect import forced_device_kind
from ...features import load_stage_config
from ...utils.cli import parse_run_args, validated_only
from ..startup.config_names import check_model_family
from ..startup.plan import stage_plan
from ..startup.precision import settle_run_precision
from ..startup.probes import missing_paths


def run_stage(stage: str, argv: Optional[Sequence[str]], doc: Optional[str]) -> int:
    args = parse_run_args(argv, doc)
    cfg = load_stage_config(stage, args.config_name, args.overrides, args.config_dir)
    check_model_family(cfg.role.model, f"model.{cfg.role.megatron.model}")
    forced_device_kind()  # MINDSPEED_RL_DEVICE names a kind (its device is checked when the run starts)
    settle_run_precision(cfg)
    print(stage_plan(cfg), flush=True)
    if validated_only(cfg.dry_run, args.check, missing_paths(cfg)):
        return 0
    from . import stage_launch  # heavy imports only after validation

    return stage_launch.run(cfg)
