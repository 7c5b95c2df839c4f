"""DeepSeek-V3 (V3 / R1 / V3.1, Kimi-K2): multi-latent attention, the first layers dense, then MoE layers of
fine-grained routed experts plus shared experts, sigmoid routing with an expert bias.

Attention (MLA), per layer, in megatron-core's names:

    q = q_up(norm_q(q_down(x)))              q_a_proj / q_a_layernorm / q_b_proj    (q_proj without q_lora_rank)
    [c_kv; k_rope] = kv_down(x)              kv_a_proj_with_mqa: the latent c_kv and one RoPE key head
    [k_nope; v] = kv_up(norm_kv(c_kv))       kv_a_layernorm / kv_b_proj
    q, k = [q_nope; rope(q_rope)], [k_nope; rope(k_rope)]   RoPE on interleaved pairs (YaRN-scaled)

Routing: s = sigmoid(router(x)); experts chosen by s + b (the expert bias, ``e_score_correction_bias``) among the
``topk_group`` best of ``n_group`` groups (a group's score: the sum of its two best); weights s_topk / sum(s_topk)
times ``routed_scaling_factor``; the shared experts add their MLP for every token. The bias moves only with
``moe_router_bias_update_rate`` > 0 (megatron's rule); RL keeps it frozen by default and sends it to the rollout
engines with the weights. Multi-token-prediction layers (``num_nextn_predict_layers``) are not trained: the
converters read past them and say how many tensors they left.
"""

from __future__ import annotations

from typing import List

from ..config_cls.model_config import ModelConfig
from .base import (
    EXPERT_MG,
    HF_LAYER,
    MG_LAYER,
    FamilyError,
    LayerNames,
    ModelFamily,
    moe_transformer_fields,
    rope_parameters,
)

_ATTENTION = [
    ("self_attn.kv_a_proj_with_mqa.weight", "self_attention.linear_kv_down_proj.weight"),
    ("self_attn.kv_a_layernorm.weight", "self_attention.kv_layernorm.weight"),
    ("self_attn.kv_b_proj.weight", "self_attention.linear_kv_up_proj.weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
]
_LOW_RANK_Q = [
    ("self_attn.q_a_proj.weight", "self_attention.linear_q_down_proj.weight"),
    ("self_attn.q_a_layernorm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.q_b_proj.weight", "self_attention.linear_q_up_proj.weight"),
]
_FULL_Q = [("self_attn.q_proj.weight", "self_attention.linear_q_proj.weight")]


class DeepseekV3(ModelFamily):
    name = "deepseek_v3"
    aliases = ("deepseekv3", "deepseek-v3", "kimi_k2")
    hf_model_types = ("deepseek_v3", "kimi_k2")
    architecture = "DeepseekV3ForCausalLM"
    chat_template = "deepseek3"
    qk_layernorm = True  # megatron's q_layernorm / kv_layernorm are MLA's latent norms
    moe = True
    layer_spec = "mindspeed_rl.models.latent_attention:latent_block_spec"
    # MLA's projections are column-parallel (the down projections are gathered before their norms)
    tp_rules = ((r"\.linear_(q|q_down|q_up|kv_down|kv_up)_proj\.", "dim0"),)

    def attention_parameters(self, model: ModelConfig) -> int:
        """Multi-latent attention: the low-rank projections and their norms."""
        h, n = model.hidden_size, model.num_attention_heads
        qk, r = model.qk_head_dim + model.qk_pos_emb_head_dim, model.q_lora_rank
        q = h * n * qk if r is None else h * r + r + r * n * qk
        kv_rank = model.kv_lora_rank
        kv = h * (kv_rank + model.qk_pos_emb_head_dim) + kv_rank + kv_rank * n * (model.qk_head_dim + model.v_head_dim)
        return q + kv + n * model.v_head_dim * h

    def extra_model_fields(self, hf: dict) -> dict:
        rope = rope_parameters(hf)
        if not hf.get("rope_interleave", True):
            raise FamilyError("deepseek_v3 with rope_interleave false: megatron-core's MLA rotates interleaved pairs")
        if hf.get("topk_method", "noaux_tc") != "noaux_tc" or hf.get("scoring_func", "sigmoid") != "sigmoid":
            raise FamilyError(
                "deepseek_v3 routing other than topk_method noaux_tc with sigmoid scores is not supported"
            )
        if not hf.get("norm_topk_prob", True):
            raise FamilyError("deepseek_v3 with norm_topk_prob false: megatron's sigmoid router always normalises")
        groups, topk = int(hf.get("n_group") or 1), int(hf["num_experts_per_tok"])
        chosen = int(hf.get("topk_group") or 1)
        if groups > 1 and topk // chosen != 2:
            raise FamilyError(
                f"deepseek_v3 scores a group by its two best experts; megatron by its num_experts_per_tok / topk_group "
                f"best ({topk} / {chosen}): the two agree only when that is 2"
            )
        fields = dict(
            kv_channels=None,
            group_query_attention=False,
            num_query_groups=None,
            multi_latent_attention=True,
            q_lora_rank=hf.get("q_lora_rank"),
            kv_lora_rank=int(hf["kv_lora_rank"]),
            qk_head_dim=int(hf["qk_nope_head_dim"]),
            qk_pos_emb_head_dim=int(hf["qk_rope_head_dim"]),
            v_head_dim=int(hf["v_head_dim"]),
            num_experts=int(hf["n_routed_experts"]),
            moe_router_topk=topk,
            moe_ffn_hidden_size=int(hf["moe_intermediate_size"]),
            n_shared_experts=int(hf["n_shared_experts"]) if hf.get("n_shared_experts") else None,
            first_k_dense_replace=int(hf.get("first_k_dense_replace", 0)),
            norm_topk_prob=True,
            moe_router_score_function="sigmoid",
            moe_router_enable_expert_bias=True,
            moe_router_num_groups=groups if groups > 1 else None,
            moe_router_group_topk=chosen if groups > 1 else None,
            moe_router_topk_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
            moe_aux_loss_coeff=0.0,
        )
        if rope.get("rope_type", rope.get("type")) == "yarn":
            fields.update(
                rope_scaling_type="yarn",
                rope_scaling_factor=float(rope["factor"]),
                rope_scaling_original_max_position_embeddings=int(rope.get("original_max_position_embeddings", 4096)),
                beta_fast=float(rope.get("beta_fast", 32.0)),
                beta_slow=float(rope.get("beta_slow", 1.0)),
                rope_scaling_mscale=float(rope.get("mscale", 1.0)),
                rope_scaling_mscale_all_dim=float(rope.get("mscale_all_dim", 0.0)),
            )
        return fields

    def extra_hf_fields(self, model: ModelConfig) -> dict:
        fields = {
            "head_dim": model.qk_pos_emb_head_dim,
            "num_key_value_heads": model.num_attention_heads,
            "q_lora_rank": model.q_lora_rank,
            "kv_lora_rank": model.kv_lora_rank,
            "qk_nope_head_dim": model.qk_head_dim,
            "qk_rope_head_dim": model.qk_pos_emb_head_dim,
            "v_head_dim": model.v_head_dim,
            "n_routed_experts": model.num_experts,
            "num_experts_per_tok": model.moe_router_topk,
            "moe_intermediate_size": model.moe_ffn_hidden_size,
            "n_shared_experts": model.n_shared_experts or 0,
            "first_k_dense_replace": model.first_k_dense_replace,
            "n_group": model.moe_router_num_groups or 1,
            "topk_group": model.moe_router_group_topk or 1,
            "routed_scaling_factor": model.moe_router_topk_scaling_factor or 1.0,
            "norm_topk_prob": True,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",  # vLLM loads e_score_correction_bias only then
            "rope_interleave": True,
            "num_nextn_predict_layers": 0,
        }
        if model.rope_scaling_type == "yarn":
            fields["rope_scaling"] = {
                "rope_type": "yarn",
                "factor": model.rope_scaling_factor,
                "original_max_position_embeddings": model.rope_scaling_original_max_position_embeddings,
                "beta_fast": model.beta_fast,
                "beta_slow": model.beta_slow,
                "mscale": model.rope_scaling_mscale,
                "mscale_all_dim": model.rope_scaling_mscale_all_dim,
            }
        return fields

    def transformer_config_fields(self, model: ModelConfig) -> dict:
        yarn = model.rope_scaling_type == "yarn"
        dense = model.first_k_dense_replace
        return {
            "multi_latent_attention": True,
            "qk_layernorm": True,
            "q_lora_rank": model.q_lora_rank,
            "kv_lora_rank": model.kv_lora_rank,
            "qk_head_dim": model.qk_head_dim,
            "qk_pos_emb_head_dim": model.qk_pos_emb_head_dim,
            "v_head_dim": model.v_head_dim,
            "rope_type": "yarn" if yarn else "rope",
            "rotary_base": model.rotary_base,
            "rotary_scaling_factor": model.rope_scaling_factor if yarn else 1.0,
            "original_max_position_embeddings": model.rope_scaling_original_max_position_embeddings,
            "beta_fast": model.beta_fast,
            "beta_slow": model.beta_slow,
            "mscale": model.rope_scaling_mscale if yarn else 1.0,
            "mscale_all_dim": model.rope_scaling_mscale_all_dim if yarn else 0.0,
            **moe_transformer_fields(model),
            "moe_layer_freq": [0] * dense + [1] * (model.num_layers - dense),
            "moe_shared_expert_intermediate_size": (
                model.moe_ffn_hidden_size * model.n_shared_experts if model.n_shared_experts else None
            ),
            "moe_router_score_function": "sigmoid",
            "moe_router_enable_expert_bias": model.moe_router_enable_expert_bias,
            "moe_router_bias_update_rate": model.moe_router_bias_update_rate,
            "moe_router_num_groups": model.moe_router_num_groups,
            "moe_router_group_topk": model.moe_router_group_topk,
            "moe_router_topk_scaling_factor": model.moe_router_topk_scaling_factor,
            "moe_router_pre_softmax": False,
            "moe_router_load_balancing_type": "seq_aux_loss" if model.moe_aux_loss_coeff > 0 else "none",
        }

    def check(self, model: ModelConfig, path: str = "model") -> None:
        from ..config_cls.base import ConfigError

        super().check(model, path)
        if not model.multi_latent_attention:
            raise ConfigError(
                f"{path}.multi_latent_attention", "deepseek_v3 models use multi-latent attention; set true"
            )
        if model.moe_router_score_function != "sigmoid" or not model.norm_topk_prob:
            raise ConfigError(
                f"{path}.moe_router_score_function", "deepseek_v3 routes by sigmoid scores, normalised (norm_topk_prob)"
            )

    def vllm_head_dim(self, model: ModelConfig) -> int:
        """vLLM's MLA attends over the latent and the RoPE key: one head of kv_lora_rank + qk_pos_emb_head_dim."""
        return model.kv_lora_rank + model.qk_pos_emb_head_dim

    def untrained_hf_names(self, hf_names, cfg: ModelConfig) -> List[str]:
        """Tensors of multi-token-prediction layers (numbered after the last decoder layer): not trained here."""
        return [n for n in hf_names if n.startswith("model.layers.") and int(n.split(".")[2]) >= cfg.num_layers]

    def layer_names(self, i: int, cfg: ModelConfig) -> LayerNames:
        h, m = HF_LAYER.format(i=i), MG_LAYER.format(i=i)
        pairs = [
            ("input_layernorm.weight", "input_layernorm.weight"),
            ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
        ]
        pairs += _ATTENTION + (_LOW_RANK_Q if cfg.q_lora_rank else _FULL_Q)
        if i < cfg.first_k_dense_replace:
            mlps = [("mlp.", "mlp.")]
        else:
            pairs += [("mlp.gate.weight", "mlp.router.weight")]
            if cfg.moe_router_enable_expert_bias:
                pairs += [("mlp.gate.e_score_correction_bias", "mlp.router.expert_bias")]
            mlps = [(f"mlp.experts.{e}.", EXPERT_MG.format(e=e)) for e in range(cfg.num_experts)]
            if cfg.n_shared_experts:
                mlps.append(("mlp.shared_experts.", "mlp.shared_experts."))
        renamed = [(h + hf, m + mg) for hf, mg in pairs]
        renamed += [(h + hp + "down_proj.weight", m + mp + "linear_fc2.weight") for hp, mp in mlps]
        fc1 = [
            ((h + hp + "gate_proj.weight", h + hp + "up_proj.weight"), m + mp + "linear_fc1.weight") for hp, mp in mlps
        ]
        return LayerNames(renamed, [], fc1)
