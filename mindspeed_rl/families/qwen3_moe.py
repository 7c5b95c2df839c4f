"""Qwen3-MoE: Qwen3's attention (qk-layernorm, no bias) with a routed mixture of experts in every layer.

Routing: p = softmax(router(x)); the top-k experts by p serve the token with weights p_topk, renormalised
to sum to 1 when ``norm_topk_prob``. megatron-core's softmax-after-top-k (``moe_router_pre_softmax``
false) is exactly that renormalised form; without renormalisation it takes the softmax first.
"""

from ..config_cls.model_config import ModelConfig
from .base import FamilyError, ModelFamily, moe_transformer_fields


class Qwen3Moe(ModelFamily):
    name = "qwen3_moe"
    aliases = ("qwen3-moe", "qwen3moe")
    hf_model_types = ("qwen3_moe",)
    architecture = "Qwen3MoeForCausalLM"
    chat_template = "qwen3"
    qk_layernorm = True
    moe = True

    def extra_model_fields(self, hf: dict) -> dict:
        if int(hf.get("decoder_sparse_step", 1)) != 1 or hf.get("mlp_only_layers"):
            raise FamilyError(
                "qwen3_moe with dense layers (decoder_sparse_step != 1 or mlp_only_layers) is not "
                "supported: every layer must be a MoE layer"
            )
        experts = hf.get("num_experts", hf.get("num_local_experts"))
        if experts is None:
            raise KeyError("num_experts")
        return {
            "num_experts": int(experts),
            "moe_router_topk": int(hf["num_experts_per_tok"]),
            "moe_ffn_hidden_size": int(hf["moe_intermediate_size"]),
            "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),  # transformers' defaults
            "moe_aux_loss_coeff": float(hf.get("router_aux_loss_coef", 0.001)),
        }

    def extra_hf_fields(self, model: ModelConfig) -> dict:
        return {
            "num_experts": model.num_experts,
            "num_experts_per_tok": model.moe_router_topk,
            "moe_intermediate_size": model.moe_ffn_hidden_size,
            "norm_topk_prob": model.norm_topk_prob,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "router_aux_loss_coef": model.moe_aux_loss_coeff,
            "output_router_logits": False,
        }

    def transformer_config_fields(self, model: ModelConfig) -> dict:
        return {
            **super().transformer_config_fields(model),
            **moe_transformer_fields(model),
            "moe_router_pre_softmax": not model.norm_topk_prob,
            "moe_router_score_function": "softmax",
            "moe_router_load_balancing_type": "aux_loss" if model.moe_aux_loss_coeff > 0 else "none",
        }
