"""A run's precision settled on this device: ``bf16: auto`` and ``generate_config.dtype: auto`` get the
accelerator's answer (config_cls/precision_rules.py applies it), the one warning of bf16 set where the device only
emulates it, and what a family whose engine kernels need bf16 does then. Every entry point and launch calls
:func:`settle_run_precision` before the plan is printed or a worker starts; a second call changes nothing."""

from __future__ import annotations

from typing import Any, Optional

from ...accelerator import DeviceUnavailable, accelerator_class, get_accelerator
from ...config_cls.base import ConfigError
from ...features.precision import (
    AUTO,
    HostPrecision,
    PrecisionChoice,
    megatron_sections,
    roles_of,
    settle_precision,
    settled,
)


def settle_run_precision(cfg: Any) -> PrecisionChoice:
    """Settle ``cfg``'s precision (ConfigError naming the key where the device cannot answer an ``auto``); prints
    the warning of an emulated bf16 once."""
    if settled(cfg):
        return cfg.precision
    host = device_answer(cfg)
    choice = settle_precision(cfg, host)
    if choice.warning:
        print(choice.warning, flush=True)
    choice.rollout_note = rollout_note(cfg, host)
    return choice


def device_kind() -> Optional[str]:
    """This process's device kind, None where the one MINDSPEED_RL_DEVICE names is not here (a dry run)."""
    try:
        return get_accelerator().kind
    except DeviceUnavailable:
        return None


def device_answer(cfg: Any) -> Optional[HostPrecision]:
    """The accelerator's answer where a role's bf16 is auto or true (None when nothing asks, or when only a set
    bf16 asks and the device cannot be found here: its launch names that); with the measured cost of bf16 where
    it is emulated and a role sets it."""
    values = [m.bf16 for m in megatron_sections(cfg)]
    auto = AUTO in values
    if not auto and True not in values:
        return None
    key = next((f"{r.name}_config.bf16" for r in roles_of(cfg) if r.megatron.bf16 == AUTO), "megatron_training.bf16")
    try:
        acc = get_accelerator()
    except DeviceUnavailable as exc:  # a ConfigError naming MINDSPEED_RL_DEVICE
        if not auto:
            return None
        raise ConfigError(key, f"auto asks the device whether it runs bf16 natively, but {exc}") from None
    try:
        host = acc.host_precision()
    except NotImplementedError as exc:
        if not auto:
            return None
        raise ConfigError(key, f"auto: {exc}; set true or false") from None
    if not host.native_bf16 and True in values:
        host.bf16_slowdown = acc.bf16_slowdown()
    return host


def rollout_note(cfg: Any, host: Optional[HostPrecision]) -> Optional[str]:
    """Where this device's vLLM kernels for the actor's model need bf16 and the engines are not bf16, or need native
    bf16 and the device has none: what happens instead (the megatron-core engine under backend auto) and why."""
    gen = getattr(cfg, "generate", None)
    kind = device_kind()
    if gen is None or kind is None or gen.backend == "fallback":
        return None
    from ...families import get_family

    model = cfg.actor.model
    family = get_family(model.model_type_hf)
    linear = (model.linear_key_head_dim, model.linear_value_head_dim) if model.linear_attention_freq else None

    def reason(dtype: str, native_bf16: Optional[bool] = None) -> Optional[str]:
        return accelerator_class(kind).vllm_unusable_reason(
            family.vllm_head_dim(model),
            latent=model.multi_latent_attention,
            linear_head_dims=linear,
            dtype=dtype,
            native_bf16=native_bf16,
        )

    now = reason(gen.dtype, host.native_bf16 if host is not None else None)
    if not now or reason("bfloat16", native_bf16=True):
        return None  # vLLM runs it here, or cannot for a reason that is not the precision
    then = "the megatron-core engine generates instead" if gen.backend == "auto" else "backend vllm is refused"
    if host is not None and not host.native_bf16:
        return f"{now}: {then}"
    return f"{now}: {then}; generate_config.dtype bfloat16 keeps vLLM"
