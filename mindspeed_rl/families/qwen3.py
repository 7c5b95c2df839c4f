"""Qwen3 dense: Qwen2.5's layer without the q/k/v bias, with RMSNorm on every query and key head
(``q_norm`` / ``k_norm`` <-> megatron's ``q_layernorm`` / ``k_layernorm``) and an explicit head_dim."""

from .base import ModelFamily


class Qwen3(ModelFamily):
    name = "qwen3"
    aliases = ()
    hf_model_types = ("qwen3",)
    architecture = "Qwen3ForCausalLM"
    chat_template = "qwen3"
    qk_layernorm = True
