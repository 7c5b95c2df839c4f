"""Each role's parallel layout: TP x PP x CP divides its devices, TP the heads, EP the experts and DP; the rollout
engines' TP against the devices and the model; how weights reach rollout workers; and what the device lacks for a
layout (sequence parallelism for MoE layers under TP)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from ..config_cls.run_config import role_key
from ..utils.cli import UserError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig


def check_role(role: RoleConfig) -> None:
    """TP x PP x CP divides the role's devices, TP the heads, EP the experts and DP."""
    m, model = role.megatron, role.model
    if role.num_devices % (role.tp * role.pp * role.cp):
        key = "context_parallel_size" if role.cp > 1 else "tensor_model_parallel_size"
        raise ConfigError(
            role_key(role, key),
            f"TP {role.tp} x PP {role.pp}"
            + (f" x CP {role.cp}" if role.cp > 1 else "")
            + f" = {role.tp * role.pp * role.cp} does not divide the "
            f"{role.name}'s {role.num_devices} devices (rl_config.{role.name}_resource.num_npus)",
        )
    if model.num_attention_heads % role.tp:
        raise ConfigError(
            role_key(role, "tensor_model_parallel_size"),
            f"TP {role.tp} does not divide num_attention_heads {model.num_attention_heads} of model {m.model}",
        )
    if model.kv_heads % role.tp:
        raise ConfigError(
            role_key(role, "tensor_model_parallel_size"),
            f"TP {role.tp} does not divide num_query_groups {model.kv_heads} of model {m.model}",
        )
    ep = m.expert_model_parallel_size
    if ep > 1 and not model.num_experts:
        raise ConfigError(
            role_key(role, "expert_model_parallel_size"),
            f"{ep} needs a mixture-of-experts model; {m.model} is dense",
        )
    if model.num_experts and role.tp > 1 and not m.sequence_parallel:  # megatron-core's own requirement
        raise ConfigError(
            role_key(role, "sequence_parallel"),
            f"false with TP {role.tp} on the mixture-of-experts model {m.model}: megatron-core runs MoE layers "
            "under TP only with sequence parallelism; set it true",
        )
    if model.num_experts and model.num_experts % ep:
        raise ConfigError(
            role_key(role, "expert_model_parallel_size"),
            f"EP {ep} does not divide num_experts {model.num_experts} of model {m.model}",
        )
    if role.dp % ep:
        raise ConfigError(
            role_key(role, "expert_model_parallel_size"),
            f"EP {ep} does not divide the {role.name}'s data-parallel size {role.dp} "
            f"(devices {role.num_devices} / (TP {role.tp} x PP {role.pp}"
            + (f" x CP {role.cp}" if role.cp > 1 else "")
            + "))",
        )


def check(cfg: PPOConfig) -> None:
    """Infer TP against the devices; how weights reach rollout workers."""
    rl, gen = cfg.rl, cfg.generate
    itp, tp = gen.infer_tensor_parallel_size, cfg.actor.tp
    if rl.rollout_resource is None and itp % tp and tp % itp:
        raise ConfigError(
            "generate_config.infer_tensor_parallel_size",
            f"{itp} is neither a multiple nor a divisor of the actor's TP {tp}",
        )
    if rl.rollout_resource is not None:
        if rl.rollout_resource.num_npus % itp:
            raise ConfigError(
                "generate_config.infer_tensor_parallel_size",
                f"{itp} does not divide the rollout workers' {rl.rollout_resource.num_npus} devices "
                "(rl_config.rollout_resource.num_npus)",
            )
    elif cfg.actor.num_devices % itp:
        raise ConfigError(
            "generate_config.infer_tensor_parallel_size",
            f"{itp} does not divide the actor's {cfg.actor.num_devices} devices",
        )
    if gen.weight_transfer == "vllm_native":
        if rl.rollout_resource is None:
            raise ConfigError(
                "generate_config.weight_transfer",
                "vllm_native carries weights to rollout workers on devices of their own: set "
                "rl_config.rollout_resource (the integrated actor loads its engine in its own process)",
            )
        if gen.backend == "fallback":
            raise ConfigError(
                "generate_config.weight_transfer",
                "vllm_native needs the vLLM engine, but generate_config.backend is fallback",
            )


def preflight(cfg: PPOConfig, accelerator) -> None:
    """megatron-core trains MoE layers under TP only with sequence parallelism, which some devices lack."""
    for role in cfg.roles:
        moe_under_tp = role.trains and role.model.num_experts and role.tp > 1
        if moe_under_tp and not accelerator.fused_features()["sequence_parallel"]:
            raise UserError(
                f"{role_key(role, 'tensor_model_parallel_size')}: {role.tp} on the mixture-of-experts model "
                f"{role.megatron.model}: megatron-core trains MoE layers under TP only with sequence parallelism, "
                f"which {accelerator.kind} lacks (torch norm); split the experts with expert_model_parallel_size "
                "instead"
            )
