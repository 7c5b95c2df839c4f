"""Qwen3-VL (dense): Qwen3's language model (q/k norms, no q/k/v bias) with interleaved multimodal rotary
positions, fed by a ViT without windows whose DeepStack mergers add image features to the outputs of the
first language-model layers (families/vision/qwen3_vit.py).

Its checkpoints keep transformers' module names: ``model.language_model.*``, ``model.visual.*``, ``lm_head``;
those are read and written (vLLM's Qwen3-VL loader maps only these).
"""

from __future__ import annotations

from typing import Optional

from ..config_cls.model_config import ModelConfig
from .base import ModelFamily
from .fused_experts import FusedExperts
from .qwen2_5_vl import LM_PREFIX, SAVED_VISION_PREFIX, VISION_PREFIX, Qwen25VL
from .qwen3_moe import Qwen3Moe


class Qwen3VL(Qwen25VL):
    name = "qwen3_vl"
    aliases = ("qwen3-vl", "qwen3vl")
    hf_model_types = ("qwen3_vl",)
    architecture = "Qwen3VLForConditionalGeneration"
    qkv_bias = False
    qk_layernorm = True
    default_mrope_section = [24, 20, 20]  # transformers' default for Qwen3-VL
    extra_rope = {"mrope_interleaved": True}

    def vllm_head_dim(self, model: ModelConfig) -> int:
        return ModelFamily.vllm_head_dim(self, model)

    def vllm_unusable_reason(self, model: ModelConfig) -> Optional[str]:
        return None

    def vision_config(self, hf: dict):
        from .vision.qwen3_vit import Qwen3VisionConfig

        return Qwen3VisionConfig.from_hf(hf["vision_config"])

    def build_tower(self, vision: dict):
        from .vision.qwen3_vit import Qwen3VisionTower

        return Qwen3VisionTower(self.vision_config({"vision_config": vision}))

    def post_build(self, gpt, model: ModelConfig) -> None:
        """The tower, and megatron's contiguous mrope sections replaced by Qwen3-VL's interleaved layout."""
        from .vision.positions import interleaved_mrope

        super().post_build(gpt, model)
        rotary = gpt.rotary_pos_emb
        rotary.forward = lambda position_ids, mrope_section, cp_group=None: interleaved_mrope(
            rotary.inv_freq, position_ids, mrope_section
        )

    def saved_hf_name(self, name: str) -> str:
        return LM_PREFIX + name[len("model.") :] if name.startswith("model.") else name

    def extra_mcore_to_hf(self, name: str) -> Optional[str]:
        return VISION_PREFIX + name[len(SAVED_VISION_PREFIX) :] if name.startswith(SAVED_VISION_PREFIX) else None


class Qwen3VLMoe(FusedExperts, Qwen3VL, Qwen3Moe):
    """Qwen3-VL's MoE variant: Qwen3-MoE's layers (every layer routed, top-k renormalised) under Qwen3-VL's tower
    and rotary. Its checkpoints fuse each layer's experts (``families/fused_experts.py``): the Hub's
    ``mlp.experts.gate_up_proj`` [E, hidden, 2 x ffn] (gate columns first) and ``mlp.experts.down_proj`` [E, ffn,
    hidden], the transposes of linear weights, are written (vLLM's loader transposes them back); transformers 5 saves
    its modules' layout, [E, 2 x ffn, hidden] and [E, hidden, ffn], and both are read (told apart by shape; when
    hidden = 2 x ffn, as the Hub's)."""

    name = "qwen3_vl_moe"
    aliases = ("qwen3-vl-moe", "qwen3vlmoe")
    hf_model_types = ("qwen3_vl_moe",)
    architecture = "Qwen3VLMoeForConditionalGeneration"
    hub_experts_transposed = True

    def extra_model_fields(self, hf: dict) -> dict:
        moe = dict(Qwen3Moe.extra_model_fields(self, hf), norm_topk_prob=True)  # its router always renormalises
        return dict(Qwen3VL.extra_model_fields(self, hf), **moe)
