"""Qwen2.5-VL: Qwen2.5's language model with 3D multimodal rotary positions (mrope), fed image tokens by a
window-attention ViT (models/vision/qwen25_vit.py).

HF checkpoints hold the language model under ``model.language_model.`` and the tower under ``model.visual.``
(transformers >= 4.52); ``text_hf_names`` renames the former to Qwen2's layout so the layer maps are Qwen2's.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ..config_cls.model_config import ModelConfig
from .qwen2 import Qwen25

LM_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."


class Qwen25VL(Qwen25):
    name = "qwen2_5_vl"
    aliases = ("qwen2.5-vl", "qwen25vl")
    hf_model_types = ("qwen2_5_vl",)
    architecture = "Qwen2_5_VLForConditionalGeneration"

    def model_config_from_hf(self, hf: dict) -> ModelConfig:
        text = dict(hf.get("text_config") or hf)  # transformers 5 nests the language model's fields
        text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", False))
        if not mrope_section_of(text):
            text["rope_scaling"] = hf.get("rope_scaling") or hf.get("rope_parameters")
        return super().model_config_from_hf(text)

    def extra_model_fields(self, hf: dict) -> dict:
        return dict(position_embedding_type="mrope", mrope_section=mrope_section_of(hf))

    def check(self, model: ModelConfig, path: str = "model") -> None:
        from ..config_cls.base import ConfigError

        super().check(model, path)
        raise ConfigError(
            f"{path}.model_type_hf",
            "qwen2_5_vl: the model and its parity with transformers exist (models/vision), but images do not yet "
            "flow through data, rollout and the trainer (docs/vision.md); train a text family meanwhile",
        )

    def transformer_config_fields(self, model: ModelConfig) -> dict:
        return dict(super().transformer_config_fields(model), mrope_section=list(model.mrope_section or []))

    def vision_config(self, hf: dict):
        from ..models.vision.qwen25_vit import VisionConfig

        return VisionConfig.from_hf(hf["vision_config"])

    @staticmethod
    def image_token_id(hf: dict) -> int:
        return int(hf.get("image_token_id", hf.get("text_config", {}).get("image_token_id", 151655)))


def mrope_section_of(config: dict) -> Optional[list]:
    for key in ("rope_parameters", "rope_scaling"):
        section = (config.get(key) or {}).get("mrope_section")
        if section:
            return list(section)
    return None


def split_hf_state(state: Dict[str, torch.Tensor]):
    """(language-model tensors in Qwen2's names, vision-tower tensors in the tower's own names)."""
    text, vision = {}, {}
    for name, tensor in state.items():
        if name.startswith(VISION_PREFIX):
            vision[name[len(VISION_PREFIX) :]] = tensor
        elif name.startswith(LM_PREFIX):
            text["model." + name[len(LM_PREFIX) :]] = tensor
        else:
            text[name] = tensor  # lm_head.weight
    return text, vision
