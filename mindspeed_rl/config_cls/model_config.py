"""Model architecture section: one file per model under configs/model/<name>.yaml."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Any, Dict, List, Optional, Sequence, Tuple

from .base import ConfigError, opt

# every name mindspeed_rl.families accepts (a test keeps the two in step)
FAMILY_NAMES = (
    "qwen25",
    "qwen2",
    "qwen2.5",
    "qwen3",
    "llama3",
    "llama",
    "llama2",
    "llama3.1",
    "llama31",
    "qwen3_moe",
    "qwen3-moe",
    "qwen3moe",
    "qwen2_5_vl",
    "qwen2.5-vl",
    "qwen25vl",
    "qwen3_vl",
    "qwen3-vl",
    "qwen3vl",
    "qwen3_vl_moe",
    "qwen3-vl-moe",
    "qwen3vlmoe",
    "deepseek_v3",
    "deepseekv3",
    "deepseek-v3",
    "kimi_k2",
    "qwen3_next",
    "qwen3-next",
    "qwen3next",
    "qwen3_5",
    "qwen3.5",
    "qwen35",
    "qwen3_5_moe",
    "qwen3.5-moe",
    "qwen35moe",
)


@dataclass
class ModelConfig:
    """Transformer architecture, Megatron naming; ``model_type_hf`` names the family (mindspeed_rl/families)."""

    num_layers: int = opt(doc="Number of transformer layers.", ge=1)
    hidden_size: int = opt(doc="Hidden (model) dimension.", ge=1)
    ffn_hidden_size: int = opt(doc="MLP inner dimension (per gate/up branch with swiglu).", ge=1)
    num_attention_heads: int = opt(doc="Query heads.", ge=1)
    max_position_embeddings: int = opt(doc="Longest position the RoPE tables cover.", ge=1)
    padded_vocab_size: Optional[int] = opt(
        None, "Embedding rows; padded past the tokenizer's vocab so TP can split it evenly.", ge=1
    )
    make_vocab_size_divisible_by: int = opt(
        128,
        "When padded_vocab_size is not given, the tokenizer's vocab is padded to a multiple "
        "of this times tensor_model_parallel_size.",
        ge=1,
    )
    kv_channels: Optional[int] = opt(None, "Head dimension; default hidden_size / num_attention_heads.", ge=1)
    group_query_attention: bool = opt(False, "Use grouped-query attention (num_query_groups K/V heads).")
    num_query_groups: Optional[int] = opt(None, "K/V heads when group_query_attention is true.", ge=1)
    rotary_base: float = opt(10000.0, "RoPE base (theta).", gt=0)
    rotary_percent: float = opt(1.0, "Fraction of the head dimension that gets RoPE.", gt=0, le=1)
    position_embedding_type: str = opt(
        "rope",
        "Position embedding (mrope: 3D temporal/height/width rotary of vision-language models).",
        choices=("rope", "mrope", "learned_absolute"),
    )
    vision_config: Optional[Dict[str, Any]] = opt(
        None, "Vision-language families: the vision tower, in the HF config.json's vision_config names."
    )
    image_token_id: Optional[int] = opt(None, "Vision-language families: the image placeholder token.", ge=0)
    mrope_section: Optional[List[int]] = opt(
        None, "With mrope: rotary frequencies given to the temporal, height and width positions (sum = head_dim / 2)."
    )
    use_rotary_position_embeddings: bool = opt(True, "Legacy Megatron spelling of position_embedding_type rope.")
    normalization: str = opt("RMSNorm", "Norm layer.", choices=("RMSNorm", "LayerNorm"))
    norm_epsilon: float = opt(1e-5, "Norm epsilon.", gt=0)
    swiglu: bool = opt(True, "SwiGLU MLP (gate and up projections fused in linear_fc1).")
    add_qkv_bias: bool = opt(False, "Bias on the Q/K/V projection only (Qwen2 family).")
    disable_bias_linear: bool = opt(True, "No bias on any other linear layer.")
    untie_embeddings_and_output_weights: bool = opt(
        False, "Separate output layer instead of reusing the word embeddings."
    )
    attention_softmax_in_fp32: bool = opt(True, "Compute the attention softmax in fp32.")
    use_mcore_models: bool = opt(True, "Megatron-core GPTModel (the only implementation here).")
    qk_layernorm: bool = opt(False, "RMSNorm on each query and key head before RoPE (Qwen3 family).")
    rope_scaling_type: Optional[str] = opt(
        None,
        "RoPE frequency scaling: none, llama3 (Llama 3.1+) or yarn (DeepSeek-V3).",
        choices=(None, "llama3", "yarn"),
    )
    rope_scaling_factor: float = opt(8.0, "llama3 rope scaling: factor.", gt=0)
    rope_scaling_low_freq_factor: float = opt(1.0, "llama3 rope scaling: low_freq_factor.", gt=0)
    rope_scaling_high_freq_factor: float = opt(4.0, "llama3 rope scaling: high_freq_factor.", gt=0)
    rope_scaling_original_max_position_embeddings: int = opt(
        8192, "llama3 / yarn rope scaling: the context length the model was pre-trained with.", ge=1
    )
    beta_fast: float = opt(32.0, "yarn rope scaling: beta_fast.", gt=0)
    beta_slow: float = opt(1.0, "yarn rope scaling: beta_slow.", gt=0)
    rope_scaling_mscale: float = opt(1.0, "yarn rope scaling: mscale.", ge=0)
    rope_scaling_mscale_all_dim: float = opt(0.0, "yarn rope scaling: mscale_all_dim (also scales the softmax).", ge=0)
    multi_latent_attention: bool = opt(
        False, "Multi-latent attention (MLA, DeepSeek-V3): low-rank q and kv projections."
    )
    q_lora_rank: Optional[int] = opt(None, "MLA: rank of the query projection (None: a full q projection).", ge=1)
    kv_lora_rank: int = opt(512, "MLA: rank of the compressed key/value.", ge=1)
    qk_head_dim: int = opt(128, "MLA: query/key head dimension without RoPE.", ge=1)
    qk_pos_emb_head_dim: int = opt(64, "MLA: query/key head dimension with RoPE (one shared key head).", ge=1)
    v_head_dim: int = opt(128, "MLA: value head dimension.", ge=1)
    linear_attention_freq: Optional[int] = opt(
        None, "Hybrid linear attention (Qwen3-Next): every n-th layer full attention, the others Gated DeltaNet.", ge=1
    )
    linear_conv_kernel_dim: int = opt(4, "Gated DeltaNet: causal convolution width over q, k and v.", ge=1)
    linear_key_head_dim: int = opt(128, "Gated DeltaNet: query/key head dimension.", ge=1)
    linear_value_head_dim: int = opt(128, "Gated DeltaNet: value head dimension.", ge=1)
    linear_num_key_heads: int = opt(16, "Gated DeltaNet: query/key heads.", ge=1)
    linear_num_value_heads: int = opt(32, "Gated DeltaNet: value heads (a multiple of the key heads).", ge=1)
    attention_output_gate: bool = opt(False, "Full attention's output times sigmoid(a gate from q_proj) (Qwen3-Next).")
    layernorm_zero_centered_gamma: bool = opt(False, "Norm weights stored as w and applied as 1 + w (Qwen3-Next).")
    num_experts: Optional[int] = opt(None, "Routed experts per MoE layer (None: a dense model).", ge=1)
    moe_router_topk: int = opt(2, "Experts each token is routed to.", ge=1)
    moe_ffn_hidden_size: Optional[int] = opt(None, "Inner dimension of one expert's MLP.", ge=1)
    norm_topk_prob: bool = opt(True, "Renormalise the top-k routing weights to sum to 1 (Qwen3-MoE).")
    moe_aux_loss_coeff: float = opt(0.0, "Load-balancing auxiliary loss coefficient (0: no aux loss).", ge=0)
    moe_token_dispatcher_type: str = opt(
        "allgather", "How tokens reach their experts across expert-parallel ranks.", choices=("allgather", "alltoall")
    )
    first_k_dense_replace: int = opt(0, "The first k layers have a dense MLP, the rest MoE (DeepSeek-V3).", ge=0)
    moe_layer_freq: int = opt(1, "An MoE layer every n layers after the dense ones (only 1 is supported).", ge=1, le=1)
    n_shared_experts: Optional[int] = opt(
        None, "Shared experts every token passes through (their MLP is n x moe_ffn_hidden_size).", ge=1
    )
    moe_shared_expert_intermediate_size: Optional[int] = opt(
        None, "Inner dimension of the shared expert (Qwen3-Next; DeepSeek-V3 says n_shared_experts).", ge=1
    )
    moe_shared_expert_gate: bool = opt(False, "The shared expert's output times sigmoid(a learned gate) (Qwen3-Next).")
    moe_router_score_function: str = opt(
        "softmax", "Router scores: softmax (Qwen3-MoE) or sigmoid (DeepSeek-V3).", choices=("softmax", "sigmoid")
    )
    moe_router_enable_expert_bias: bool = opt(
        False, "A per-expert bias added to the scores when choosing experts (aux-loss-free balancing)."
    )
    moe_router_bias_update_rate: float = opt(
        0.0,
        "How fast the expert bias follows the load during training (megatron's rule); 0 freezes it, the RL default.",
        ge=0,
    )
    moe_router_num_groups: Optional[int] = opt(None, "Experts in groups; a token chooses among the best groups.", ge=1)
    moe_router_group_topk: Optional[int] = opt(None, "Groups a token may choose experts from.", ge=1)
    moe_router_topk_scaling_factor: Optional[float] = opt(
        None, "The routing weights times this factor (DeepSeek-V3's routed_scaling_factor).", gt=0
    )
    model_type_hf: str = opt(
        "qwen25",
        "Model family (mindspeed_rl/families): its HF names, TP rules, the HF "
        "config vLLM gets. MindSpeed-LLM's spellings are accepted.",
        choices=FAMILY_NAMES,
    )

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        """K/V heads: num_query_groups with grouped-query attention (validate requires it), else one per head."""
        if self.group_query_attention and self.num_query_groups:
            return self.num_query_groups
        return self.num_attention_heads

    @property
    def expert_ffn_hidden_size(self) -> int:
        """One expert's inner MLP dimension (megatron's default for an unset moe_ffn_hidden_size: ffn_hidden_size)."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def check(self, path: str = "model", given: AbstractSet[str] = frozenset()) -> None:
        """Heads, query groups and experts against the sizes (build_section calls it; a family's own
        requirements are checked by trainer/startup/config_names.py)."""
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{path}.num_attention_heads",
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}; set kv_channels",
            )
        if self.group_query_attention:
            if self.num_query_groups is None:
                raise ConfigError(f"{path}.num_query_groups", "required when group_query_attention is true")
            if self.num_attention_heads % self.num_query_groups:
                raise ConfigError(
                    f"{path}.num_query_groups",
                    f"{self.num_query_groups} does not divide num_attention_heads {self.num_attention_heads}",
                )
        if self.num_experts:
            if self.moe_router_topk > self.num_experts:
                raise ConfigError(
                    f"{path}.moe_router_topk", f"{self.moe_router_topk} exceeds num_experts {self.num_experts}"
                )
            if self.moe_ffn_hidden_size is None:
                raise ConfigError(f"{path}.moe_ffn_hidden_size", "required with num_experts")
            if self.first_k_dense_replace >= self.num_layers:
                raise ConfigError(
                    f"{path}.first_k_dense_replace",
                    f"{self.first_k_dense_replace} dense layers leave no MoE layer of {self.num_layers}",
                )
            self._check_expert_groups(path)
        if not self.use_mcore_models:
            raise ConfigError(f"{path}.use_mcore_models", "only megatron-core models are supported; set true")
        if self.position_embedding_type == "mrope" and (
            not self.mrope_section or len(self.mrope_section) != 3 or sum(self.mrope_section) * 2 != self.head_dim
        ):
            raise ConfigError(
                f"{path}.mrope_section",
                f"mrope needs three sections summing to head_dim / 2 = {self.head_dim // 2}, got {self.mrope_section}",
            )

    def _check_expert_groups(self, path: str) -> None:
        groups, chosen, experts = self.moe_router_num_groups, self.moe_router_group_topk, self.num_experts or 0
        if groups is None or chosen is None:
            if groups != chosen:
                raise ConfigError(f"{path}.moe_router_group_topk", "set with moe_router_num_groups (both or neither)")
            return
        if experts % groups:
            raise ConfigError(
                f"{path}.moe_router_num_groups", f"{groups} groups do not divide num_experts {self.num_experts}"
            )
        if chosen > groups:
            raise ConfigError(f"{path}.moe_router_group_topk", f"{chosen} exceeds moe_router_num_groups {groups}")
        if self.moe_router_topk > chosen * (experts // groups):
            raise ConfigError(
                f"{path}.moe_router_topk",
                f"{self.moe_router_topk} experts do not fit in {chosen} groups of {experts // groups}",
            )

    @property
    def moe_layers(self) -> int:
        """Layers with a mixture of experts (after the first_k_dense_replace dense ones)."""
        return self.num_layers - self.first_k_dense_replace if self.num_experts else 0

    def is_linear_attention_layer(self, i: int) -> bool:
        """Layer ``i`` (from 0) is Gated DeltaNet: the model is hybrid and i + 1 is no multiple of the period."""
        return bool(self.linear_attention_freq and (i + 1) % self.linear_attention_freq)

    def lora_layer_shapes(self) -> Dict[str, Tuple[str, int, int, int]]:
        """Per LoRA target: (kind, fan in, fan out, experts) of its full, un-sharded weight; experts is 0 for a
        dense layer, else the number of experts, each with its own adapters (split over EP)."""
        h, f, d = self.hidden_size, self.ffn_hidden_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.kv_heads * d
        mult = 2 if self.swiglu else 1
        shapes = {"linear_qkv": ("column", h, q + 2 * kv, 0), "linear_proj": ("row", q, h, 0)}
        if self.num_experts:
            e, n = self.expert_ffn_hidden_size, self.num_experts
            shapes.update(linear_fc1=("column", h, e * mult, n), linear_fc2=("row", e, h, n))
        else:
            shapes.update(linear_fc1=("column", h, f * mult, 0), linear_fc2=("row", f, h, 0))
        return shapes

    def lora_parameter_count(
        self, r: int, targets: Sequence[str], tp: int = 1, ep: int = 1, layers_per_rank: Optional[int] = None
    ) -> Tuple[int, int]:
        """(adapter parameters of the model, of one rank) for LoRA of rank ``r`` on ``targets``. Column layers
        split B, row layers split A over TP; each MoE expert's adapters live on its EP rank; a rank holds
        ``layers_per_rank`` layers (its pipeline stage; default all)."""
        shapes = self.lora_layer_shapes()
        total = per_rank = 0
        for target in targets:
            if target not in shapes:
                continue
            kind, fan_in, fan_out, experts = shapes[target]
            total += (experts or 1) * r * (fan_in + fan_out)
            local = r * fan_in + r * fan_out // tp if kind == "column" else r * fan_in // tp + r * fan_out
            per_rank += (experts // ep if experts else 1) * local
        return self.num_layers * total, (layers_per_rank or self.num_layers) * per_rank
