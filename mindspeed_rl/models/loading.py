"""A checkpoint's language model on one rank for generation (cli/generate.py, evaluation's megatron-core engine):
a Megatron checkpoint (any TP/PP/EP layout, merged) or a HF folder (converted on the fly)."""

from __future__ import annotations

import os
import tempfile
from typing import Dict, Tuple

import torch

from ..checkpoint.convert import hf_to_mg
from ..checkpoint.megatron_layout import TRACKER
from ..checkpoint.megatron_reader import iter_mg_stages, read_mg_config
from ..config_cls import MegatronConfig, ModelConfig
from .builder import build_gpt_model


class ModelLoadError(ValueError):
    """A folder that holds no language model to generate with (the message says why)."""


def _merged(load_dir: str) -> Tuple[dict, Dict[str, torch.Tensor]]:
    config = read_mg_config(load_dir)[0]
    weights: Dict[str, torch.Tensor] = {}
    for _, stage in iter_mg_stages(load_dir):
        weights.update({k: v.clone() for k, v in stage.items()})
    return config, weights


def load_generation_model(load_dir: str):
    """(GPTModel on one rank, ModelConfig) from a Megatron checkpoint or a HF folder."""
    if os.path.isfile(os.path.join(load_dir, TRACKER)):
        config, weights = _merged(load_dir)
    elif os.path.isfile(os.path.join(load_dir, "config.json")):
        with tempfile.TemporaryDirectory() as tmp:
            hf_to_mg(load_dir, tmp)
            config, weights = _merged(tmp)
    else:
        raise ModelLoadError(f"{load_dir}: neither a Megatron checkpoint ({TRACKER}) nor a HF folder (config.json)")
    if config.get("orm"):
        raise ModelLoadError(f"{load_dir}: a reward/critic checkpoint (value head) cannot generate text")
    model_cfg = ModelConfig(**config["model"])
    gpt = build_gpt_model(model_cfg, MegatronConfig(model="checkpoint"))
    missing = set(dict(gpt.named_parameters())) - set(weights)
    if missing:
        raise ModelLoadError(f"{load_dir}: checkpoint lacks {sorted(missing)[:3]}")
    with torch.no_grad():
        for name, param in gpt.named_parameters():
            param.copy_(weights[name].to(param.dtype))
    return gpt, model_cfg
