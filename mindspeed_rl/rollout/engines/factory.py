"""Pick the rollout engine: generate_config.backend = vllm | fallback | auto (logs which and why)."""

from __future__ import annotations

import logging
from typing import Optional

from ...config_cls.generate_config import GenerateConfig
from ...config_cls.model_config import ModelConfig
from .base import RolloutEngine

log = logging.getLogger(__name__)


class RolloutUnavailable(RuntimeError):
    """backend: vllm was asked for but vLLM cannot run this model here."""


def make_rollout_engine(
    model: ModelConfig,
    gen: GenerateConfig,
    kind: str,
    eos_token_id: Optional[int],
    pad_token_id: int = 0,
    seed: int = 1,
    bf16: bool = False,
    capture_routes: bool = False,
    processor_dir: Optional[str] = None,
) -> RolloutEngine:
    """``processor_dir``: the folder of a vision-language model's image processor (its tokenizer folder)."""
    from .vllm_engine import vllm_unusable_reason

    reason = vllm_unusable_reason(model, gen, kind) if gen.backend in ("auto", "vllm") else "backend: fallback"
    if gen.backend == "vllm" and reason:
        raise RolloutUnavailable(f"generate_config.backend: vllm, but {reason}")
    precision = gen.rollout_quantization
    if precision != "none" and reason:  # the fallback engine runs the trained weights as they are
        raise RolloutUnavailable(f"generate_config.rollout_quantization: {precision} needs vLLM, but {reason}")
    if reason is None:
        from .vllm_engine import VllmEngine

        layout = f"infer TP {gen.infer_tensor_parallel_size}"
        if gen.infer_expert_parallel_size > 1:
            layout += f" x DP {gen.infer_data_parallel_size} = EP {gen.infer_expert_parallel_size}"
        quantized = "" if precision == "none" else f", {precision} weights and activations"
        log.warning("rollout engine: vLLM (%s, %s%s)", kind, layout, quantized)
        eos = eos_token_id if eos_token_id is not None else 0
        return VllmEngine(model, gen, kind, eos, pad_token_id, seed, capture_routes, processor_dir)
    from .fallback_engine import FallbackEngine

    log.warning("rollout engine: megatron-core fallback (%s)", reason)
    return FallbackEngine(model, eos_token_id, pad_token_id, bf16, gen.batch_invariant, capture_routes)
