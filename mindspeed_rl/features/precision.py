"""Precision: what each role trains in (``bf16: auto`` settled with the device's answer), what the rollout engines
run in (``generate_config.dtype: auto`` follows the actor), and low-precision rollout
(``generate_config.rollout_quantization``): the derived values and refusals of both. Nothing here asks the device:
the accelerator answers with a :class:`HostPrecision` and :func:`settle_precision` applies it; until then a
config that says ``auto`` is unsettled and nothing may build a model from it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional

from ..config_cls.base import ConfigError, yaml_spelling
from ..config_cls.run_config import HostPrecision, PrecisionChoice, role_key

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig

AUTO = "auto"
# the vLLM dtype of each trained precision (generate_config.dtype: auto follows the actor)
ENGINE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
HOW_DTYPE = {True: "dtype auto: the actor's", False: "as set"}


def plan_lines(cfg: Any) -> List[str]:
    """The batch plan's lines: what the run trains and generates in, and why."""
    choice = getattr(cfg, "precision", None)
    if choice is None:  # a config built in code: its run settles it
        given = yaml_spelling(cfg.roles[0].megatron.bf16)
        return [f"  precision : bf16 {given} (settled from the device when the run starts)"]
    note = [f"  kernels   : {choice.rollout_note}"] if choice.rollout_note else []
    return [f"  precision : {choice.summary}"] + note


def trained_precision(m: Any) -> str:
    """bf16, fp16 or fp32 of a settled MegatronConfig."""
    if m.bf16 == AUTO:
        raise ValueError("megatron bf16 is still auto: settle_precision() decides it from the device first")
    return "bf16" if m.bf16 else "fp16" if m.fp16 else "fp32"


def check_role(role: RoleConfig) -> None:
    """``bf16`` and ``fp16`` are not both on, and ``auto`` (bf16 where the device runs it natively, else fp32)
    does not sit beside ``fp16: true``."""
    m = role.megatron
    if m.bf16 == AUTO and m.fp16:
        raise ConfigError(
            role_key(role, "bf16"),
            "auto together with fp16: true; auto picks bf16 or fp32 from the device: set fp16 false, or bf16 false "
            "to train in fp16",
        )
    if m.bf16 is True and m.fp16:
        raise ConfigError(role_key(role, "fp16"), "bf16 and fp16 are both true; pick one")


def settled(cfg: Any) -> bool:
    return getattr(cfg, "precision", None) is not None


def needs_answer(cfg: Any) -> bool:
    """Whether settling needs the device's answer: a role's bf16 is auto. (A role that trains in bf16 as set takes
    one too where it can be had: the device may only emulate bf16, which earns one warning.)"""
    return any(m.bf16 == AUTO for m in megatron_sections(cfg))


def roles_of(cfg: Any) -> List[RoleConfig]:
    """Every role a run builds a precision for: its roles, and a PPO run's critic even where it starts none."""
    critic = getattr(cfg, "critic", None)
    return list(cfg.roles) + ([critic] if critic is not None and critic not in cfg.roles else [])


def megatron_sections(cfg: Any) -> List[Any]:
    """megatron_training and every role's merged section: where a bf16 is auto, true or false."""
    return [cfg.megatron_training] + [role.megatron for role in roles_of(cfg)]


def settle_precision(cfg: Any, host: Optional[HostPrecision]) -> PrecisionChoice:
    """Every ``bf16: auto`` becomes the device's answer (bf16 where it runs bf16 natively, else fp32), the engines'
    ``dtype: auto`` the actor's precision, and the choice with its reason is recorded as ``cfg.precision``.
    ``host``: the device's answer (None only where :func:`needs_answer` is false)."""
    if settled(cfg):
        return cfg.precision
    if needs_answer(cfg) and host is None:
        raise ValueError("settle_precision needs the device's answer (HostPrecision) for bf16: auto")
    actor, gen = cfg.roles[0], getattr(cfg, "generate", None)
    given, gen_auto = yaml_spelling(actor.megatron.bf16), gen is not None and gen.dtype == AUTO
    set_bf16 = any(role.megatron.bf16 is True for role in roles_of(cfg))  # before auto becomes true or false
    for m in megatron_sections(cfg):
        if m.bf16 == AUTO:
            m.bf16 = host is not None and host.native_bf16
    trained = trained_precision(actor.megatron)
    engine_dtype = ""
    if gen is not None:
        engine_dtype = gen.dtype = ENGINE_DTYPES[trained] if gen_auto else gen.dtype
        check(cfg, gen_auto)  # the engines' dtype is known now
    engines = f"{engine_dtype} ({HOW_DTYPE[gen_auto]})" if gen is not None else ""
    choice = PrecisionChoice(
        trained, engine_dtype, summary(cfg, host, given, engines), bf16_warning(cfg, host, set_bf16)
    )
    cfg.precision = choice
    return choice


def summary(cfg: Any, host: Optional[HostPrecision], given: str, engines: str) -> str:
    """ "fp32 (bf16: auto; this CPU has no native bf16: AVX2); rollout engines float32 (dtype auto: the actor's)"
    (``given``: the actor's bf16 as the config gave it; ``engines``: the engines' dtype and why, "" without)."""
    per_role = {role.name: trained_precision(role.megatron) for role in cfg.roles}
    text = (
        next(iter(per_role.values()))
        if len(set(per_role.values())) == 1
        else ", ".join(f"{name} {p}" for name, p in per_role.items())
    )
    why = [f"bf16: {given}"]
    if host is not None and (given == AUTO or "bf16" in per_role.values()):
        why.append(host.why + (f", bf16 matmuls {host.bf16_slowdown:.0f}x slower than fp32" if _slow(host) else ""))
    return f"{text} ({'; '.join(why)})" + (f"; rollout engines {engines}" if engines else "")


def bf16_warning(cfg: Any, host: Optional[HostPrecision], set_bf16: bool) -> Optional[str]:
    """One warning where a role trains in bf16 as set and the device only emulates it (the measured cost)."""
    if not set_bf16 or host is None or host.native_bf16:
        return None
    cost = f"; bf16 matmuls measured {host.bf16_slowdown:.0f}x slower than fp32 here" if _slow(host) else ""
    return f"warning: {_bf16_key(cfg)} is true, but {host.why}{cost}; bf16: auto would train in fp32 here"


def _slow(host: HostPrecision) -> bool:
    return host.bf16_slowdown is not None and host.bf16_slowdown >= 1.5


def _bf16_key(cfg: Any) -> str:
    """Where the config sets bf16: a role's section, else megatron_training."""
    raw = cfg.raw or {}
    for role in roles_of(cfg):
        if "bf16" in (raw.get(f"{role.name}_config") or {}):
            return role_key(role, "bf16")
    return "megatron_training.bf16"


# the engine dtypes each precision runs (vLLM refuses float32 with FP8; INT8 takes it where the device's kernel does)
QUANTIZED_DTYPES = {"fp8": ("bfloat16", "float16"), "int8": ("bfloat16", "float16", "float32")}


def derive(cfg: PPOConfig) -> None:
    """Under a quantized rollout an unset ``rollout_correction.rollout_is`` is token-level truncated IS (before the
    algorithm is resolved: it decides the importance weights)."""
    if cfg.generate.rollout_quantization != "none" and cfg.rl.rollout_correction.rollout_is is None:
        cfg.rl.rollout_correction.rollout_is = "token"


def check(cfg: PPOConfig, settled_from_auto: bool = False) -> None:
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
    if gen.dtype != AUTO and gen.dtype not in QUANTIZED_DTYPES[precision]:  # auto: checked once settled
        given = gen.dtype
        if settled_from_auto:
            given = f"auto ({gen.dtype}: the actor trains in {trained_precision(cfg.actor.megatron)})"
        raise ConfigError(
            "generate_config.dtype",
            f"{given}, but rollout_quantization {precision} runs an engine of dtype "
            f"{' or '.join(QUANTIZED_DTYPES[precision])}",
        )
    if gen.weight_transfer == "vllm_native":
        raise ConfigError(
            "generate_config.weight_transfer",
            f"vllm_native with rollout_quantization {precision} is not checked (vLLM's transfer engines write "
            "the quantized parameters directly, without quantizing again): use channel",
        )
