"""Llama 2 / 3.x: no biases, SwiGLU, RMSNorm, RoPE; Llama 3.1+ scale the RoPE frequencies ("llama3").

llama3 scaling, per frequency f with wavelength w = 2 pi / f and context C (original_max_position_embeddings):

    f' = f                               if w < C / high_freq_factor
    f' = f / factor                      if w > C / low_freq_factor
    f' = (1 - s) f / factor + s f        otherwise, s = (C / w - low_freq_factor) / (high - low_freq_factor)

megatron-core builds this with C = 8192 and factors 1 / 4 fixed, so :meth:`post_build` recomputes the
model's frequencies from the model section's own values.
"""

from ..config_cls.model_config import ModelConfig
from .base import FamilyError, ModelFamily, rope_parameters


class Llama3(ModelFamily):
    name = "llama3"
    aliases = ("llama", "llama2", "llama3.1", "llama31")
    hf_model_types = ("llama",)
    architecture = "LlamaForCausalLM"
    chat_template = "llama3"

    def extra_model_fields(self, hf: dict) -> dict:
        rope = rope_parameters(hf)
        kind = rope.get("rope_type") or rope.get("type")
        if kind in (None, "default"):
            return {}
        if kind != "llama3":
            raise FamilyError(f"rope scaling {kind!r} is not supported for llama (only llama3)")
        return {
            "rope_scaling_type": "llama3",
            "rope_scaling_factor": float(rope["factor"]),
            "rope_scaling_low_freq_factor": float(rope.get("low_freq_factor", 1.0)),
            "rope_scaling_high_freq_factor": float(rope.get("high_freq_factor", 4.0)),
            "rope_scaling_original_max_position_embeddings": int(rope.get("original_max_position_embeddings", 8192)),
        }

    def extra_hf_fields(self, model: ModelConfig) -> dict:
        if model.rope_scaling_type != "llama3":
            return {}
        return {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": model.rope_scaling_factor,
                "low_freq_factor": model.rope_scaling_low_freq_factor,
                "high_freq_factor": model.rope_scaling_high_freq_factor,
                "original_max_position_embeddings": model.rope_scaling_original_max_position_embeddings,
            }
        }

    def post_build(self, gpt, model: ModelConfig) -> None:
        rope = getattr(gpt, "rotary_pos_emb", None)
        if model.rope_scaling_type != "llama3" or rope is None:
            return
        rope.inv_freq = rope._apply_scaling(
            rope.inv_freq,
            factor=model.rope_scaling_factor,
            low_freq_factor=model.rope_scaling_low_freq_factor,
            high_freq_factor=model.rope_scaling_high_freq_factor,
            original_max_position_embeddings=model.rope_scaling_original_max_position_embeddings,
        )
