"""Qwen2.5-VL: Qwen2.5's language model with 3D multimodal rotary positions (mrope), fed image tokens by a
window-attention ViT (families/vision/qwen25_vit.py).

The Hub's checkpoints (and transformers' ``save_pretrained``) hold the language model in Qwen2's layout
(``model.layers.*``, ``lm_head``) and the tower under ``visual.``; transformers' modules, and some folders saved
from them, nest them as ``model.language_model.*`` / ``model.visual.*``. Both are read; the Hub's is written.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch

from ..config_cls.model_config import ModelConfig
from .qwen2 import Qwen25

LM_PREFIX = "model.language_model."  # transformers' module names, in memory and in some saved folders
VISION_PREFIX = "model.visual."
SAVED_VISION_PREFIX = "visual."  # the Hub's checkpoints (and transformers' save_pretrained): model.layers.*, visual.*


class Qwen25VL(Qwen25):
    name = "qwen2_5_vl"
    aliases = ("qwen2.5-vl", "qwen25vl")
    hf_model_types = ("qwen2_5_vl",)
    architecture = "Qwen2_5_VLForConditionalGeneration"
    default_mrope_section: Optional[list] = None  # when config.json gives none
    extra_rope: dict = {}  # written into the language model's rope_parameters

    def model_config_from_hf(self, hf: dict) -> ModelConfig:
        text = dict(hf.get("text_config") or hf)  # transformers 5 nests the language model's fields
        if "tie_word_embeddings" in hf or "tie_word_embeddings" not in text:  # transformers 5 reads the top level
            text["tie_word_embeddings"] = hf.get("tie_word_embeddings", False)
        if not mrope_section_of(text):
            text["rope_scaling"] = hf.get("rope_scaling") or hf.get("rope_parameters")
        text["_vision"] = (hf.get("vision_config"), self.image_token_id(hf))
        return super().model_config_from_hf(text)

    def extra_model_fields(self, hf: dict) -> dict:
        vision, image_token = hf.get("_vision", (None, None))
        return dict(
            position_embedding_type="mrope",
            mrope_section=mrope_section_of(hf) or self.default_mrope_section,
            vision_config=self.plain_vision_config(vision),
            image_token_id=image_token,
        )

    def post_build(self, gpt, model: ModelConfig) -> None:
        from .vision.vl_model import attach_vision_tower

        if model.vision_config:
            attach_vision_tower(gpt, self.build_tower(model.vision_config), model.image_token_id)

    def vision_parameters(self, model: ModelConfig, part: str = "all") -> int:
        """The tower (patch and position embeddings, blocks), the projector (the patch merger, and Qwen3-VL's DeepStack
        mergers) or both ("all")."""
        v = model.vision_config
        if not v:
            return 0
        h, i, merge, out = (
            v["hidden_size"],
            v["intermediate_size"],
            v.get("spatial_merge_size", 2),
            v["out_hidden_size"],
        )
        qwen3 = "deepstack_visual_indexes" in v  # LayerNorm with biases, a plain MLP, learned positions
        patch = (
            v.get("in_channels", 3) * v.get("temporal_patch_size", 2) * v.get("patch_size", 16 if qwen3 else 14) ** 2
        )
        attention = (h * 3 * h + 3 * h) + (h * h + h)
        merged = h * merge**2
        mergers = merged * merged + merged + merged * out + out
        if qwen3:
            block = 4 * h + attention + (h * i + i + i * h + h)
            tower = patch * h + h + v.get("num_position_embeddings", 2304) * h + v["depth"] * block
            projector = 2 * h + mergers + len(v["deepstack_visual_indexes"]) * (2 * merged + mergers)
        else:
            block = 2 * h + attention + (2 * (h * i + i) + i * h + h)
            tower = patch * h + v["depth"] * block
            projector = h + mergers
        return {"all": tower + projector, "tower": tower, "projector": projector}[part]

    def build_tower(self, vision: dict):
        from .vision.qwen25_vit import Qwen25VisionTower

        return Qwen25VisionTower(self.vision_config({"vision_config": vision}))

    def check(self, model: ModelConfig, path: str = "model") -> None:
        from ..config_cls.base import ConfigError

        super().check(model, path)
        if not model.vision_config or model.image_token_id is None:
            key = "vision_config" if not model.vision_config else "image_token_id"
            raise ConfigError(f"{path}.{key}", "qwen2_5_vl models need their vision tower and image token; set it")

    def hf_config(self, model: ModelConfig, eos_token_id: int, pad_token_id: int, torch_dtype: str = "float32") -> dict:
        """transformers 5's layout: the language model's fields under text_config (its rotary with the mrope
        section), the tower's under vision_config, the image token at the top."""
        text = super().hf_config(model, eos_token_id, pad_token_id, torch_dtype)
        top = {key: text.pop(key) for key in ("architectures", "model_type", "tie_word_embeddings", "torch_dtype")}
        rope = {"rope_type": "default", "rope_theta": text.pop("rope_theta"), "mrope_section": model.mrope_section}
        text.update(model_type=self.hf_model_types[0] + "_text", rope_parameters=dict(rope, **self.extra_rope))
        vision = dict(model.vision_config or {}, model_type=self.hf_model_types[0] + "_vision")
        top.update(text_config=text, vision_config=vision, image_token_id=model.image_token_id)
        top.update(eos_token_id=eos_token_id, pad_token_id=pad_token_id, vocab_size=model.padded_vocab_size)
        return top

    def transformer_config_fields(self, model: ModelConfig) -> dict:
        return dict(super().transformer_config_fields(model), mrope_section=list(model.mrope_section or []))

    def hf_name_aliases(self, name: str) -> Tuple[str, ...]:
        return (name, LM_PREFIX + name[len("model.") :]) if name.startswith("model.") else (name,)

    def extra_hf_to_mcore(self, hf_names: Iterable[str]) -> Dict[str, str]:
        out = {}
        for name in hf_names:
            for prefix in (SAVED_VISION_PREFIX, VISION_PREFIX):
                if name.startswith(prefix):
                    out[name] = "visual." + name[len(prefix) :]
        return out

    def extra_mcore_to_hf(self, name: str) -> Optional[str]:
        return name if name.startswith(SAVED_VISION_PREFIX) else None  # written in the Hub's layout

    def vision_config(self, hf: dict):
        """The tower's config from a HF config's ``vision_config``."""
        from .vision.qwen25_vit import VisionConfig

        return VisionConfig.from_hf(hf["vision_config"])

    def plain_vision_config(self, vision: Optional[dict]) -> Optional[dict]:
        """The vision_config fields the tower reads (a config section keeps plain values only)."""
        if not vision:
            return None
        keep = set(type(self.vision_config({"vision_config": vision})).__dataclass_fields__) | {"rope_parameters"}
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in vision.items() if k in keep}

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
    """(language-model tensors in Qwen2's names, vision-tower tensors in the tower's own names), from either layout."""
    text, vision = {}, {}
    for name, tensor in state.items():
        for prefix in (VISION_PREFIX, SAVED_VISION_PREFIX):
            if name.startswith(prefix):
                vision[name[len(prefix) :]] = tensor
                break
        else:
            text["model." + name[len(LM_PREFIX) :] if name.startswith(LM_PREFIX) else name] = tensor
    return text, vision
