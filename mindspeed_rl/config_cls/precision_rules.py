"""Low-precision rollout (``generate_config.rollout_quantization``): what it derives and what it refuses. The
engines run the policy quantized, so the trainer samples from a policy other than the one it trains: the
rollout correction is on unless the config says ``off``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import ConfigError

if TYPE_CHECKING:
    from .generate_config import GenerateConfig
    from .ppo_config import PPOConfig
    from .rl_config import RLConfig

# the engine dtypes each precision runs (vLLM refuses float32 with FP8; INT8 takes it where the device's kernel does)
QUANTIZED_DTYPES = {"fp8": ("bfloat16", "float16"), "int8": ("bfloat16", "float16", "float32")}


def derive_rollout_correction(rl: RLConfig, gen: GenerateConfig) -> None:
    """Under a quantized rollout an unset ``rollout_correction.rollout_is`` is token-level truncated IS."""
    if gen.rollout_quantization != "none" and rl.rollout_correction.rollout_is is None:
        rl.rollout_correction.rollout_is = "token"


def check_rollout_precision_keys(cfg: PPOConfig) -> None:
    """A quantized rollout needs a vLLM engine (FP8: of a 16-bit dtype; INT8: the device decides, in the
    preflight) fed by our weight channel (its updates go through vLLM's reload, which processes them again: FP8
    quantized there, INT8 before the transfer)."""
    gen = cfg.generate
    precision = gen.rollout_quantization
    if precision == "none":
        return
    if gen.backend == "fallback":
        raise ConfigError(
            "generate_config.rollout_quantization",
            f"{precision} quantizes vLLM engines; backend fallback (megatron-core) runs the trained weights as "
            "they are: set backend auto or vllm",
        )
    if gen.dtype not in QUANTIZED_DTYPES[precision]:
        raise ConfigError(
            "generate_config.dtype",
            f"{gen.dtype}, but rollout_quantization {precision} runs an engine of dtype "
            f"{' or '.join(QUANTIZED_DTYPES[precision])}",
        )
    if gen.weight_transfer == "vllm_native":
        raise ConfigError(
            "generate_config.weight_transfer",
            f"vllm_native with rollout_quantization {precision} is not checked (vLLM's transfer engines write "
            "the quantized parameters directly, without quantizing again): use channel",
        )
