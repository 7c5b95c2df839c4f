"""Expert parallelism of the rollout engines (generate_config.infer_expert_parallel_size, infer_data_parallel_size).

vLLM spreads a MoE model's routed experts over an engine's tensor-parallel ranks times its data-parallel ranks:
EP = infer TP x infer DP, each rank holding E / EP whole experts instead of a TP slice of every expert. With DP 1 the
experts are split over one engine's TP ranks; with DP > 1, DP neighbouring engines (each infer TP ranks with prompts
of its own) run their MoE layers together: every MoE layer gathers their tokens, each rank applies its experts, and
the outputs go back (so every engine of such a group generates at every rollout call, with or without prompts).
At a weight sync each rank receives only its own experts (vLLM's linear placement: rank r holds experts
r E / EP .. (r + 1) E / EP - 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Tuple

from ..config_cls.base import ConfigError
from ..utils.cli import UserError
from ..utils.units import readable_bytes

if TYPE_CHECKING:
    from ..config_cls.generate_config import GenerateConfig
    from ..config_cls.model_config import ModelConfig
    from ..config_cls.run_config import PPOConfig

EP_KEY = "generate_config.infer_expert_parallel_size"
DP_KEY = "generate_config.infer_data_parallel_size"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def coupled_ranks(gen: GenerateConfig) -> int:
    """Ranks whose MoE layers run together: infer TP x infer DP (= EP when expert parallelism is on)."""
    return gen.infer_tensor_parallel_size * gen.infer_data_parallel_size


def owned_experts(num_experts: int, ep: int, ep_rank: int) -> Tuple[int, int]:
    """The [first, last + 1) global experts EP rank ``ep_rank`` holds in vLLM's linear placement."""
    per_rank = num_experts // ep
    return ep_rank * per_rank, (ep_rank + 1) * per_rank


def expert_bytes_per_rank(model: ModelConfig, ep: int, dtype: str) -> int:
    """Routed-expert weight bytes one rollout rank holds: E / EP experts of every MoE layer, each
    (2 or 3) x hidden x expert FFN (gated MLPs have a third matrix)."""
    matrices = 3 if model.swiglu else 2
    per_expert = matrices * model.hidden_size * model.expert_ffn_hidden_size
    return (model.num_experts or 0) // ep * per_expert * model.moe_layers * DTYPE_BYTES.get(dtype, 2)


def check(cfg: PPOConfig) -> None:
    """EP = infer TP x DP divides the experts and the rollout devices; DP > 1 needs expert parallelism, the
    actor's engines and steps taken together (no in-flight weight updates); the vLLM engine."""
    gen, actor = cfg.generate, cfg.actor
    ep, tp, dp = gen.infer_expert_parallel_size, gen.infer_tensor_parallel_size, gen.infer_data_parallel_size
    if ep == 1:
        if dp > 1:
            raise ConfigError(
                DP_KEY,
                f"{dp} without expert parallelism: the rollout engines are data-parallel replicas already (one per "
                f"infer_tensor_parallel_size ranks); infer_data_parallel_size groups engines whose experts are "
                f"shared, so set {EP_KEY} to infer TP x DP = {tp * dp}, or this key to 1",
            )
        return
    experts = actor.model.num_experts
    if not experts:
        raise ConfigError(EP_KEY, f"{ep} needs a mixture-of-experts model; the actor's {actor.megatron.model} is dense")
    if ep != tp * dp:
        hint = f" (for EP {ep} at infer TP {tp}: {DP_KEY} {ep // tp})" if ep % tp == 0 else ""
        raise ConfigError(
            EP_KEY,
            f"{ep} is not infer TP {tp} x infer DP {dp} = {tp * dp}: vLLM spreads the experts over an engine's "
            f"TP ranks and its DP ranks together{hint}",
        )
    if experts % ep:
        raise ConfigError(EP_KEY, f"{ep} does not divide the {experts} experts of {actor.megatron.model}")
    devices = cfg.rollout_devices or actor.num_devices
    where = "rl_config.rollout_resource.num_npus" if cfg.rollout_devices else "the actor's devices"
    if devices % ep:
        relation = "is larger than" if ep > devices else "does not divide"
        raise ConfigError(
            EP_KEY,
            f"{ep} (infer TP {tp} x DP {dp}) {relation} the {devices} devices of the rollout engines ({where})",
        )
    if gen.backend == "fallback":
        raise ConfigError(
            "generate_config.backend",
            f"fallback (megatron-core) generates without expert parallelism; {EP_KEY} {ep} needs vllm (or auto)",
        )
    if dp > 1 and cfg.rollout_devices:
        raise ConfigError(
            DP_KEY,
            f"{dp} with rollout workers of their own (rl_config.rollout_resource): each of their engines is a world "
            f"of its own (one that fails restarts alone), so engines cannot share MoE layers; split the experts "
            f"within an engine instead: infer_tensor_parallel_size {ep}, {DP_KEY} 1",
        )
    if dp > 1 and cfg.rl.async_training.in_flight_weight_updates:
        raise ConfigError(
            DP_KEY,
            f"{dp} with rl_config.async_training.in_flight_weight_updates: the engines of a DP group step their MoE "
            "layers together, and in-flight updates pause each engine on its own",
        )


def preflight(cfg: PPOConfig, accelerator) -> None:
    """The device's vLLM can split experts over an engine's ranks."""
    ep = cfg.generate.infer_expert_parallel_size
    missing = accelerator.vllm_expert_parallel_unavailable() if ep > 1 else ""
    if missing:
        raise UserError(f"{EP_KEY}: {ep} on {accelerator.kind}: {missing}")


def plan_lines(cfg: PPOConfig) -> List[str]:
    gen, model = cfg.generate, cfg.actor.model
    ep = gen.infer_expert_parallel_size
    if ep == 1:
        return []
    mine, whole = (readable_bytes(expert_bytes_per_rank(model, e, gen.dtype)) for e in (ep, 1))
    groups = (cfg.rollout_devices or cfg.actor.num_devices) // ep
    return [
        f"  rollout EP: EP {ep} = infer TP {gen.infer_tensor_parallel_size} x DP {gen.infer_data_parallel_size} "
        f"({groups} group(s) of {ep} ranks): {(model.num_experts or 0) // ep} of {model.num_experts} experts per rank, "
        f"{mine} of expert weights per rank in {gen.dtype} (EP 1: {whole}); each rank receives "
        "only its own experts at a weight sync"
    ]
