"""Qwen2 / Qwen2.5: GQA with a bias on q/k/v only, SwiGLU, RMSNorm, RoPE."""

from typing import Optional

from ..config_cls.model_config import ModelConfig
from .base import ModelFamily


class Qwen25(ModelFamily):
    name = "qwen25"
    aliases = ("qwen2", "qwen2.5")
    hf_model_types = ("qwen2",)
    architecture = "Qwen2ForCausalLM"
    chat_template = "qwen"
    qkv_bias = True

    def vllm_head_dim(self, model: ModelConfig) -> int:
        return model.hidden_size // model.num_attention_heads  # vLLM's Qwen2 ignores config.head_dim

    def vllm_unusable_reason(self, model: ModelConfig) -> Optional[str]:
        if model.head_dim != self.vllm_head_dim(model):
            return (
                f"vLLM's Qwen2 computes head_dim as hidden_size / num_attention_heads = "
                f"{self.vllm_head_dim(model)}; the model sets kv_channels {model.kv_channels}"
            )
        return None
