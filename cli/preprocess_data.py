"""Preprocess a dataset into indexed files, driven by configs/datasets/<name>.yaml.

    python cli/preprocess_data.py gsm8k [key=value ...]          # configs/datasets/gsm8k.yaml
    python cli/preprocess_data.py path/to/my_data.yaml input=./raw/train.jsonl workers=2

Bad rows are skipped and counted by reason (the first few are shown with their line numbers);
the run exits 0 when anything was kept, 2 when nothing was or the yaml / input is wrong.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional, Sequence

from mindspeed_rl.config_cls.base import ConfigError, build_section
from mindspeed_rl.config_cls.loader import CONFIG_DIR
from mindspeed_rl.config_cls.yaml_guard import check_yaml_text, load_yaml
from mindspeed_rl.datasets.dataset_config import DatasetConfig
from mindspeed_rl.trainer.startup.config_names import check_dataset_names
from mindspeed_rl.utils.cli import UserError, report_user_errors


def load_dataset_config(name: str, overrides: Sequence[str]) -> DatasetConfig:
    path = name if name.endswith((".yaml", ".yml")) else os.path.join(CONFIG_DIR, "datasets", f"{name}.yaml")
    if not os.path.isfile(path):
        known = sorted(f[:-5] for f in os.listdir(os.path.join(CONFIG_DIR, "datasets")) if f.endswith(".yaml"))
        raise UserError(f"no dataset config {path} (known: {', '.join(known)})")
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        for text in overrides:
            if "=" not in text:
                raise ConfigError(text, "overrides are key=value")
            key, value = text.split("=", 1)
            check_yaml_text(value, key)  # OmegaConf parses the value as YAML
        data = OmegaConf.merge(OmegaConf.create(load_yaml(path) or {}), OmegaConf.from_dotlist(list(overrides)))
        plain = OmegaConf.to_container(data, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(os.path.basename(path), str(exc).splitlines()[0]) from None
    cfg = build_section(DatasetConfig, plain, "")
    tools = check_dataset_names(cfg)
    from mindspeed_rl.datasets.readers import InputError, input_files

    try:
        input_files(cfg.input)  # a missing input is refused before anything is written
    except InputError as exc:
        raise UserError(str(exc)) from None
    if not os.path.isdir(cfg.tokenizer_name_or_path):
        raise ConfigError(
            "tokenizer_name_or_path",
            f"folder {cfg.tokenizer_name_or_path!r} ({os.path.abspath(cfg.tokenizer_name_or_path)}) does not exist",
        )
    return cfg, tools


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="dataset config name under configs/datasets/ or a yaml path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the yaml")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg, tools = load_dataset_config(args.config, args.overrides)
    from mindspeed_rl.datasets.preprocess import preprocess
    from mindspeed_rl.datasets.readers import InputError

    try:
        summary = preprocess(cfg, progress=not args.quiet, tools=tools)
    except InputError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"tokenizer_name_or_path {cfg.tokenizer_name_or_path}: {exc}") from None
    for example in summary["examples"]:
        print(f"skipped {example}")
    skipped = ", ".join(f"{k} {v}" for k, v in summary["skipped"].items()) or "none"
    print(
        f"read {summary['read']}, kept {summary['kept']}, skipped: {skipped} "
        f"({summary['read'] / max(summary['seconds'], 1e-9):.0f} rows/s, {cfg.workers} worker(s))"
    )
    if summary["kept"] == 0:
        raise UserError(
            f"{cfg.input}: no row was kept; nothing written, and the outputs of any earlier run at "
            f"{cfg.output_prefix}_* (data and summary) are left as they were"
        )
    print(f"wrote {cfg.output_prefix}_packed_*_document.bin/.idx and {cfg.output_prefix}_summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
