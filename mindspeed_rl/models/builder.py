"""Build a megatron-core GPTModel from a model section and a role's megatron settings.

Flags that only mean something on one device (fused kernels, flash attention, sequence
parallel, gradient-accumulation fusion) are accepted everywhere and mapped here, in one
place, to what the device supports (``Accelerator.fused_features``); each mapping is logged once.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F

from ..accelerator import accelerator_class, get_accelerator
from ..compat import megatron_core as compat_megatron
from ..config_cls.megatron_config import MegatronConfig
from ..config_cls.model_config import ModelConfig
from ..families import get_family
from ..features.fused_kernels import choose as choose_kernels
from ..features.precision import trained_precision
from . import fused_kernels

log = logging.getLogger(__name__)
_LOGGED: set = set()


def _say_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        log.warning(message)


def params_dtype(megatron: MegatronConfig) -> torch.dtype:
    """The weights' dtype (ValueError while bf16 is still auto: the run settles it from the device first)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[trained_precision(megatron)]


def transformer_config(model: ModelConfig, megatron: MegatronConfig, kind: Optional[str] = None):
    """megatron-core TransformerConfig for this model and role on device ``kind`` (default: this process's)."""
    from megatron.core.transformer import TransformerConfig

    kind = kind or get_accelerator().kind
    acc = accelerator_class(kind)
    feats = acc.fused_features()
    tp = megatron.tensor_model_parallel_size
    sequence_parallel = megatron.sequence_parallel and tp > 1
    if megatron.sequence_parallel and not feats["sequence_parallel"]:
        _say_once(f"sequence_parallel: not supported on {kind} (torch norm); running without it")
        sequence_parallel = False
    rope_fusion = megatron.use_fused_rotary_pos_emb and feats["rope_fusion"]  # Transformer Engine's
    grad_acc_fusion = not megatron.no_gradient_accumulation_fusion and feats["gradient_accumulation_fusion"]
    softmax_fusion = not megatron.no_masked_softmax_fusion and feats["masked_softmax_fusion"]
    if megatron.use_flash_attn and not feats["flash_attn"]:
        _say_once(f"use_flash_attn: no such kernel on {kind}; using the torch implementation")
    kernels = choose_kernels(megatron, model, feats, kind)
    for note in kernels.notes:
        _say_once(note)
    dtype = params_dtype(megatron)
    kwargs = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.kv_heads,
        kv_channels=model.head_dim,
        normalization=model.normalization,
        layernorm_epsilon=model.norm_epsilon,
        gated_linear_unit=model.swiglu,
        activation_func=F.silu if model.swiglu else F.gelu,
        add_bias_linear=not model.disable_bias_linear,
        add_qkv_bias=model.add_qkv_bias,
        attention_softmax_in_fp32=megatron.attention_softmax_in_fp32 or model.attention_softmax_in_fp32,
        hidden_dropout=megatron.hidden_dropout,
        attention_dropout=megatron.attention_dropout,
        init_method_std=megatron.init_method_std,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=megatron.pipeline_model_parallel_size,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype,
        bf16=megatron.bf16,
        fp16=megatron.fp16,
        pipeline_dtype=dtype,
        autocast_dtype=dtype,
        use_cpu_initialization=acc.cpu_initialization,
        perform_initialization=True,
        bias_activation_fusion=feats["bias_activation_fusion"] and model.swiglu,
        # megatron compiles its bias-dropout-add, recompiling as packed lengths vary: only where it fuses something
        bias_dropout_fusion=feats["bias_dropout_fusion"]
        and (megatron.hidden_dropout > 0 or not model.disable_bias_linear),
        masked_softmax_fusion=softmax_fusion,
        persist_layer_norm=False,
        apply_rope_fusion=rope_fusion,
        gradient_accumulation_fusion=grad_acc_fusion,
        cross_entropy_loss_fusion=False,
        **recompute_fields(megatron, acc),
        deallocate_pipeline_outputs=False,
    )
    kwargs.update(kernels.config_fields())
    if kernels.rope:
        fused_kernels.install_rope(kernels.by)
    kwargs.update(get_family(model.model_type_hf).transformer_config_fields(model))
    kwargs["expert_model_parallel_size"] = megatron.expert_model_parallel_size
    if megatron.context_parallel_size > 1:
        from ..features.context_parallel import ring_attention_unavailable

        reason = ring_attention_unavailable(megatron, kind)
        if reason:
            raise ValueError(f"context_parallel_algo: {reason}")
        kwargs["context_parallel_size"] = megatron.context_parallel_size
        if megatron.context_parallel_algo == "megatron_cp_algo":
            kwargs["cp_comm_type"] = "p2p"  # ring attention (Transformer Engine on CUDA)
    kwargs.update(pipeline_fields(model, megatron))
    if kwargs.get("multi_latent_attention"):
        return compat_megatron.latent_attention_config(kwargs)
    return TransformerConfig(**kwargs)


def recompute_fields(megatron: MegatronConfig, acc) -> dict:
    """Recomputation: full (method, layers) or selective (recompute_modules); recompute_norm adds megatron-core's
    layernorm module where MindSpeed does not run (on NPU MindSpeed recomputes the norms itself)."""
    granularity, modules = megatron.recompute_granularity, megatron.recompute_modules
    if megatron.recompute_norm and not acc.runs_mindspeed:
        granularity = "selective"
        modules = list(modules or (["core_attn"] if megatron.recompute_granularity == "selective" else []))
        modules += [] if "layernorm" in modules else ["layernorm"]
    fields: dict = {"recompute_granularity": granularity}
    if granularity == "full":
        fields.update(recompute_method=megatron.recompute_method, recompute_num_layers=megatron.recompute_num_layers)
    if granularity == "selective" and modules is not None:
        fields["recompute_modules"] = list(modules)
    return fields


def pipeline_fields(model: ModelConfig, megatron: MegatronConfig) -> dict:
    """TransformerConfig fields of the pipeline layout: uneven stages, or the interleaved schedule (VPP)."""
    fields: dict = {}
    if megatron.num_layer_list:
        fields.update(compat_megatron.uneven_pipeline_fields(megatron.layers_per_stage(model.num_layers)))
    vpp = megatron.virtual_stages(model.num_layers)
    if vpp > 1:  # interleaved 1F1B over vpp model chunks per pipeline rank
        fields["virtual_pipeline_model_parallel_size"] = vpp
        # a batch of sends and receives between the same two ranks (PP 2: prev = next) can pair an activation
        # with a gradient on gloo; the unbatched ops order them by rank parity
        fields["batch_p2p_comm"] = False
    return fields


def layer_spec(
    model: ModelConfig, kind: Optional[str] = None, lora: bool = False, ulysses: bool = False, config=None, stage=None
):
    """The fastest layer spec the device has: TE on CUDA (if installed), local otherwise.

    On NPU MindSpeed's adaptor patches the local spec's modules with its fused kernels. LoRA adapts the
    local spec's separate linear layers (TE fuses the input norm into the linear: its input is not x).
    ``ulysses``: the core attention wrapped in our Ulysses all-to-alls (context_parallel_algo
    ulysses_cp_algo); the ring (megatron_cp_algo) is the TE attention's own context parallelism.
    A family whose layers are not the GPT layer names its own block spec (``ModelFamily.layer_spec``: multi-latent
    attention with dense layers first, Gated DeltaNet hybrids), built from ``config`` and ``stage`` (the
    virtual-stage arguments).
    """
    from megatron.core.models.gpt import gpt_layer_specs

    from ..families import get_family
    from ..utils.plugins import import_named

    te = accelerator_class(kind or get_accelerator().kind).fused_features()["transformer_engine"]
    own = get_family(model.model_type_hf).layer_spec
    if own:
        return import_named(own)(model, config, stage, te)
    family = dict(num_experts=model.num_experts, moe_grouped_gemm=False, qk_layernorm=model.qk_layernorm)
    if not lora and te:
        spec = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(**family)
    else:
        from .attention import with_packed_attention

        spec = with_packed_attention(
            gpt_layer_specs.get_gpt_layer_local_spec(normalization=model.normalization, **family), kind
        )
    if ulysses:
        from .context_parallel import with_ulysses_attention

        spec = with_ulysses_attention(spec)
    return spec


def padded_vocab_size(model: ModelConfig, tokenizer_vocab: Optional[int], tp: int) -> int:
    if model.padded_vocab_size:
        return model.padded_vocab_size
    if tokenizer_vocab is None:
        raise ValueError("padded_vocab_size is not set and no tokenizer vocab size was given")
    multiple = model.make_vocab_size_divisible_by * tp
    return -(-tokenizer_vocab // multiple) * multiple


def build_gpt_model(
    model: ModelConfig,
    megatron: MegatronConfig,
    *,
    pre_process: Optional[bool] = None,
    post_process: Optional[bool] = None,
    vocab_size: Optional[int] = None,
    vp_stage: Optional[int] = None,
    config=None,
):
    """A GPTModel for this pipeline stage, or its model chunk ``vp_stage`` of an interleaved pipeline
    (parallel_state must be initialised); ``config``: the TransformerConfig the chunks of one model share."""
    from megatron.core import parallel_state as ps

    acc = get_accelerator()
    acc.prepare_megatron()
    compat_megatron.apply()
    config = config or transformer_config(model, megatron, acc.kind)
    vpp = megatron.virtual_stages(model.num_layers)
    first_chunk, last_chunk = vp_stage in (None, 0), vp_stage in (None, vpp - 1)
    if pre_process is None:
        pre_process = ps.is_pipeline_first_stage(ignore_virtual=True) and first_chunk
    if post_process is None:
        post_process = ps.is_pipeline_last_stage(ignore_virtual=True) and last_chunk
    vocab = vocab_size or padded_vocab_size(model, None, megatron.tensor_model_parallel_size)
    with compat_megatron.building_virtual_stage(vp_stage) as stage_kwargs:
        gpt = _gpt_model(model, megatron, config, acc.kind, vocab, pre_process, post_process, stage_kwargs)
    get_family(model.model_type_hf).post_build(gpt, model)
    fused_kernels.swap_modules(gpt, choose_kernels(megatron, model, acc.fused_features(), acc.kind))
    return acc.place_model(gpt)


def _gpt_model(model, megatron, config, kind, vocab, pre_process, post_process, stage_kwargs):
    from megatron.core.models.gpt import GPTModel

    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(
            model,
            kind,
            lora=bool(megatron.lora_r),
            ulysses=megatron.context_parallel_size > 1 and megatron.context_parallel_algo == "ulysses_cp_algo",
            config=config,
            stage=stage_kwargs,
        ),
        vocab_size=vocab,
        max_sequence_length=model.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=not model.untie_embeddings_and_output_weights,
        position_embedding_type=model.position_embedding_type,
        rotary_percent=model.rotary_percent,
        rotary_base=int(model.rotary_base),
        **stage_kwargs,
    )
