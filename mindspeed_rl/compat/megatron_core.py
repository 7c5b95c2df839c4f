"""megatron-core API differences between 0.12 (the NPU stack, MindSpeed's core_r0.12.1) and 0.16."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
from typing import Dict, Iterator, List, Optional, Tuple

_APPLIED = False


def apply() -> None:
    """Fix, once per process, what a release gets wrong when Transformer Engine is absent (every
    device: our models use megatron's local layer spec)."""
    global _APPLIED
    if _APPLIED:
        return
    _no_fp8_shards_without_transformer_engine()
    _router_without_transformer_engine()
    _recompute_without_transformer_engine()
    _latent_attention_without_transformer_engine()
    _APPLIED = True


def _no_fp8_shards_without_transformer_engine() -> None:
    """megatron-core 0.12's distributed optimizer calls ``quantize_param_shard`` on every step, and
    without Transformer Engine that raises "Invalid Transformer Engine version for FP8 distributed
    optimizer" even when no parameter is FP8. 0.13 returns early on an empty list; do the same."""
    fp8_utils = importlib.import_module("megatron.core.fp8_utils")
    if getattr(fp8_utils, "HAVE_TE", True) or getattr(fp8_utils._quantize_param_shard_impl, "mindspeed_rl", False):
        return
    original = fp8_utils._quantize_param_shard_impl

    def quantize_param_shard(model_params, *args, **kwargs):
        if len(model_params) == 0:
            return None
        return original(model_params, *args, **kwargs)

    quantize_param_shard.mindspeed_rl = True
    fp8_utils._quantize_param_shard_impl = quantize_param_shard


class _NoFP8:
    """Transformer Engine's FP8 state as it is without Transformer Engine: off."""

    @staticmethod
    def is_fp8_enabled() -> bool:
        return False

    @staticmethod
    def get_fp8_recipe() -> None:
        return None


def _recompute_without_transformer_engine() -> None:
    """megatron-core's ``CheckpointWithoutOutput`` (selective recomputation of layernorm, moe_act) sets
    ``self.fp8 = fp8 is not None``, true for its default ``fp8=False``, and then calls Transformer Engine's FP8
    state, absent without it (a NameError). Without TE that state is "no FP8" and its contexts do nothing."""
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    if getattr(random, "HAVE_TE", True):
        return
    random.__dict__.setdefault("FP8GlobalStateManager", _NoFP8)
    random.__dict__.setdefault("activation_recompute_forward", lambda **kwargs: contextlib.nullcontext())
    random.__dict__.setdefault("fp8_autocast", lambda **kwargs: contextlib.nullcontext())


def _router_without_transformer_engine() -> None:
    """megatron-core 0.16's MoE router tests ``te_general_gemm`` even when Transformer Engine is absent
    (a NameError); without TE the name means "no TE gemm". (0.12 does not use the name.)"""
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    if not getattr(moe_utils, "HAVE_TE", False):
        moe_utils.__dict__.setdefault("te_general_gemm", None)


def _latent_attention_without_transformer_engine() -> None:
    """megatron-core 0.16's multi-latent attention imports its Transformer Engine classes from the extensions module,
    which without TE defines them on a MagicMock (``HAVE_TE`` there ends up true), and then ``isinstance(linear_proj,
    TELinear)`` raises a TypeError; without TE the module's own flag must say so. (0.12 has no such test.)"""
    if importlib.util.find_spec("transformer_engine") is not None:
        return
    try:
        mla = importlib.import_module("megatron.core.transformer.multi_latent_attention")
    except ImportError:
        return
    mla.HAVE_TE = False


def latent_attention_config(fields: Dict[str, object]):
    """megatron-core's MLATransformerConfig of ``fields`` (0.16's names): 0.12 calls YaRN's original context
    ``max_position_embeddings``."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    names = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    if "original_max_position_embeddings" not in names and "original_max_position_embeddings" in fields:
        fields = dict(fields)
        fields["max_position_embeddings"] = fields.pop("original_max_position_embeddings")
    return MLATransformerConfig(**fields)


def destroy_model_parallel() -> None:
    """megatron's parallel state destroyed as if the process were new, ready for another layout.

    megatron-core 0.12's ``destroy_model_parallel`` leaves the old layout's ``*_GLOBAL_RANKS`` behind (0.16 clears
    them): a rank of the old embedding group that is not in the new one then asks for a group it does not have
    ("position embedding group is not initialized"). Every such list starts as None in a new process."""
    ps = importlib.import_module("megatron.core.parallel_state")
    ps.destroy_model_parallel()
    for name in [n for n in vars(ps) if n.startswith("_") and n.endswith("_GLOBAL_RANKS")]:
        setattr(ps, name, None)


def reset_rng_tracker() -> None:
    """Re-create megatron's model-parallel RNG tracker (after its class was replaced).

    ``initialize_rng_tracker(force_reset=...)`` was added in megatron-core 0.13; in 0.12 a tracker
    that exists is kept unless the module's ``_CUDA_RNG_STATE_TRACKER_INITIALIZED`` flag is cleared.
    """
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    if "force_reset" in inspect.signature(random.initialize_rng_tracker).parameters:
        random.initialize_rng_tracker(force_reset=True)
        return
    random._CUDA_RNG_STATE_TRACKER_INITIALIZED = False
    random.initialize_rng_tracker()


def masked_softmax(attention, scores, mask):
    """``attention.scale_mask_softmax`` of ``scores`` as its release calls it: megatron-core 0.16 passes the
    learnable softmax offset (``softmax_offset``; None unless configured), 0.12 has neither the attribute nor
    the argument."""
    offset = getattr(attention, "softmax_offset", None)
    if offset is None:
        return attention.scale_mask_softmax(scores, mask)
    return attention.scale_mask_softmax(scores, mask, offset)


def glu_options(config) -> Tuple[float, Optional[float]]:
    """The gated MLP's linear offset and clamp (megatron-core 0.12 has neither: 0 and none)."""
    return float(getattr(config, "glu_linear_offset", 0.0)), getattr(config, "activation_func_clamp_value", None)


def uneven_pipeline_fields(counts: List[int]) -> Dict[str, object]:
    """TransformerConfig fields that give pipeline stage i ``counts[i]`` transformer layers.

    megatron-core 0.13 added ``pipeline_model_parallel_layout`` (e.g. 'Et*3|t*5L'); 0.12 only knows
    ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage`` with the stages
    between them equal, so a list it cannot express is refused (ValueError). With two stages only the
    first is given: 0.12 divides the layers left by the stages left and would divide by zero.
    """
    from megatron.core.transformer import TransformerConfig

    if "pipeline_model_parallel_layout" in {f.name for f in dataclasses.fields(TransformerConfig)}:
        stages = [
            ("E" if i == 0 else "") + (f"t*{count}" if count else "") + ("L" if i == len(counts) - 1 else "")
            for i, count in enumerate(counts)
        ]
        return {"pipeline_model_parallel_layout": "|".join(stages)}
    middle = counts[1:-1]
    if len(set(middle)) > 1:
        raise ValueError(
            f"layers per stage {counts}: megatron-core before 0.13 needs the stages between the first "
            "and the last to hold the same number of layers"
        )
    if len(counts) == 2:
        return {"num_layers_in_first_pipeline_stage": counts[0]}
    return {"num_layers_in_first_pipeline_stage": counts[0], "num_layers_in_last_pipeline_stage": counts[-1]}


def router_replay_unavailable() -> str:
    """Why this megatron-core cannot replay MoE routes ("" when it can): its routers hand their top-k choice to
    ``router.router_replay`` from 0.16 on (``topk_routing_with_score_function(..., router_replay=...)``)."""
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    parameters = inspect.signature(moe_utils.topk_routing_with_score_function).parameters
    if "router_replay" not in parameters:
        return "this megatron-core's MoE router takes no replayed routes (router_replay arrives in 0.16)"
    return ""


def gated_delta_net_unavailable() -> str:
    """Why this megatron-core cannot build Qwen3-Next's layers ("" when it can): gated attention
    (``attention_output_gate``) and the Gated DeltaNet sizes (``linear_*``) are TransformerConfig fields from
    0.16 on."""
    import dataclasses

    config = importlib.import_module("megatron.core.transformer.transformer_config").TransformerConfig
    fields = {f.name for f in dataclasses.fields(config)}
    if not {"attention_output_gate", "linear_num_key_heads"} <= fields:
        return "this megatron-core has no gated attention or Gated DeltaNet sizes (attention_output_gate: 0.16)"
    try:  # the torch reference of the gated delta rule the layer computes with
        importlib.import_module("megatron.core.ssm.gated_delta_net").torch_chunk_gated_delta_rule
    except (ImportError, AttributeError) as exc:
        return f"this megatron-core lacks the torch gated delta rule ({exc})"
    return ""


def packed_positions_unavailable() -> str:
    """Why this megatron-core's packed (thd) rotary cannot take one position per packed token ("" when it can):
    0.16 maps rotary frequencies given for every packed token onto them; older releases restart every segment at
    position 0, which 3D (mrope) positions cannot survive."""
    rope_utils = importlib.import_module("megatron.core.models.common.embeddings.rope_utils")
    apply_thd = getattr(rope_utils, "_apply_rotary_pos_emb_thd", None)
    if apply_thd is None or "cu_seqlens[-1]" not in inspect.getsource(apply_thd):
        return "this megatron-core's packed rotary restarts every segment at position 0 (per-token positions: 0.16)"
    return ""


@contextlib.contextmanager
def building_virtual_stage(vp_stage: Optional[int]) -> Iterator[Dict[str, object]]:
    """GPTModel keyword arguments that build model chunk ``vp_stage`` of an interleaved pipeline (None: no
    interleaving). megatron-core 0.13 and later take ``vp_stage``; 0.12 reads the chunk from parallel_state's
    virtual rank while the layers are numbered, which is set for the construction only."""
    if vp_stage is None:
        yield {}
        return
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    if "vp_stage" in inspect.signature(GPTModel.__init__).parameters:
        yield {"vp_stage": vp_stage}
        return
    previous = ps.get_virtual_pipeline_model_parallel_rank()
    ps.set_virtual_pipeline_model_parallel_rank(vp_stage)
    try:
        yield {}
    finally:
        ps.set_virtual_pipeline_model_parallel_rank(previous)
