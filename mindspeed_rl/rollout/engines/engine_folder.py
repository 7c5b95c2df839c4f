"""The folder a vLLM engine starts from: the model's HF config.json (no weights: they arrive from the actor) and, for a
vision-language model, its processor files."""

from __future__ import annotations

import json
import os
import shutil
from typing import Dict, Optional

from ...config_cls.model_config import ModelConfig


def write_hf_config(
    folder: str, model: ModelConfig, eos_token_id: int, pad_token_id: int, quantization: Optional[Dict] = None
) -> str:
    """The model's HF config.json in ``folder`` (with ``quantization`` as its ``quantization_config``)."""
    from ...families import get_family

    os.makedirs(folder, exist_ok=True)
    config = get_family(model.model_type_hf).hf_config(model, eos_token_id, pad_token_id)
    if quantization is not None:
        config["quantization_config"] = quantization
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2)
    return folder


# what vLLM's multimodal input processing reads beside config.json (the tokenizer and the image processor)
PROCESSOR_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "chat_template.json",
    "chat_template.jinja",
)


def copy_processor(source: Optional[str], folder: str) -> None:
    """A vision-language model's processor files from ``source`` (the tokenizer folder) into the engine's folder."""
    from ...datasets.images import has_image_processor

    if source is None or not has_image_processor(source):
        raise ValueError(
            f"tokenizer_name_or_path {source}: a vision-language model's folder needs its image processor "
            "(preprocessor_config.json or processor_config.json) for vLLM to take images"
        )
    for name in PROCESSOR_FILES:
        if os.path.isfile(os.path.join(source, name)):
            shutil.copy2(os.path.join(source, name), os.path.join(folder, name))
