"""Parameter counts of a model section, for the batch plan's memory lines and the converters' checks. What differs
between kinds of layers is the family's (``ModelFamily.attention_parameters``, ``linear_attention_parameters``,
``vision_parameters``: multi-latent attention, Gated DeltaNet, vision towers); the MLP and mixture-of-experts
counts here are common to every family."""

from __future__ import annotations

from typing import Optional, Tuple

from ..config_cls.model_config import ModelConfig


def family(model: ModelConfig):
    from . import get_family

    return get_family(model.model_type_hf)


def mlp_parameters(model: ModelConfig, inner: int) -> int:
    return model.hidden_size * inner * (2 if model.swiglu else 1) + inner * model.hidden_size


def moe_layer_parameters(model: ModelConfig) -> Tuple[int, int]:
    """(router, its expert bias and the shared experts; the routed experts) of one MoE layer, (0, 0) without."""
    if not model.num_experts:
        return 0, 0
    h, e, n = model.hidden_size, model.expert_ffn_hidden_size, model.num_experts
    shared = h * n + (n if model.moe_router_enable_expert_bias else 0)
    shared += mlp_parameters(model, e * model.n_shared_experts) if model.n_shared_experts else 0
    if model.moe_shared_expert_intermediate_size:
        shared += mlp_parameters(model, model.moe_shared_expert_intermediate_size)
        shared += h if model.moe_shared_expert_gate else 0
    return shared, n * mlp_parameters(model, e)


def linear_attention_layers(model: ModelConfig) -> int:
    """Layers of linear attention (a hybrid's: all but every linear_attention_freq-th)."""
    return sum(map(model.is_linear_attention_layer, range(model.num_layers)))


def vision_parameter_count(model: ModelConfig, part: str = "all") -> int:
    """A vision-language model's tower ("tower"), projector ("projector") or both ("all"); 0 for a text model."""
    return family(model).vision_parameters(model, part) if model.vision_config else 0


def parameter_count(model: ModelConfig, vocab_size: Optional[int] = None) -> int:
    """Parameters of the GPT model (embedding, layers, final norm, output layer, a vision tower)."""
    kind = family(model)
    vocab, h = vocab_size or model.padded_vocab_size or 0, model.hidden_size
    linear = linear_attention_layers(model)
    layers = (model.num_layers - linear) * kind.attention_parameters(model) + 2 * h * model.num_layers
    layers += linear * kind.linear_attention_parameters(model)
    dense, moe = mlp_parameters(model, model.ffn_hidden_size), sum(moe_layer_parameters(model))
    layers += (model.num_layers - model.moe_layers) * dense + model.moe_layers * moe
    out = vocab * h if model.untie_embeddings_and_output_weights else 0
    return vocab * h + layers + h + out + vision_parameter_count(model)


def parameters_per_rank(model: ModelConfig, tp: int, ep: int = 1, layers: Optional[int] = None) -> Tuple[int, int]:
    """About the most parameters one rank holds, as (replicated over EP, routed experts): ``layers`` layers (its
    pipeline stage, each counted with the larger of the dense and the MoE layer) split over TP, the routed experts
    also over EP (megatron's expert tensor parallelism defaults to TP), and the embedding and output layer split
    over TP."""
    kind = family(model)
    layers = model.num_layers if layers is None else layers
    h = model.hidden_size
    shared, routed = moe_layer_parameters(model)
    routed //= ep
    dense = mlp_parameters(model, model.ffn_hidden_size) if model.moe_layers < model.num_layers else 0
    moe_layers = min(layers, model.moe_layers) if routed else 0
    linear = kind.linear_attention_parameters(model) if linear_attention_layers(model) else 0
    layer = max(kind.attention_parameters(model), linear) + 2 * h
    vocab = (model.padded_vocab_size or 0) * h * (2 if model.untie_embeddings_and_output_weights else 1)
    ends = vocab + h + vision_parameter_count(model)  # embedding, output layer, final norm, a vision tower
    rest = layers * layer + (layers - moe_layers) * dense + moe_layers * shared + ends
    return rest // tp, moe_layers * routed // tp


def active_parameter_count(model: ModelConfig, vocab_size: Optional[int] = None) -> int:
    """Parameters one token passes through (all of them for a dense model; top-k experts for MoE)."""
    total = parameter_count(model, vocab_size)
    if not model.num_experts:
        return total
    idle = (model.num_experts - model.moe_router_topk) * mlp_parameters(model, model.expert_ffn_hidden_size)
    return total - model.moe_layers * idle
