"""What the run asks of its rollout engines, checked before Ray starts against this device kind and the installed
vLLM: the quantization, the routed experts an engine returns, router replay, and which actor layouts the
megatron-core engine (``backend: fallback``, or ``auto`` where vLLM cannot run the model) can load."""

from __future__ import annotations

from typing import Optional

from ...config_cls.ppo_config import PPOConfig
from ...utils.cli import UserError


def check_rollout_engine(cfg: PPOConfig) -> None:
    """What the run asks of the rollout engine, this device kind and the installed vLLM have: its quantization,
    the routed experts it returns (unless the megatron-core engine samples) and, for router replay, megatron-core's
    replay of them (not the NPU sets' releases)."""
    from ...accelerator import get_accelerator
    from ...compat import vllm_routes
    from ...compat.megatron_core import router_replay_unavailable

    gen = cfg.generate
    if gen.rollout_quantization != "none" and gen.backend != "fallback":
        try:
            get_accelerator().vllm_quantization(gen.rollout_quantization, bool(cfg.actor.model.num_experts), gen.dtype)
        except ValueError as exc:
            raise UserError(f"generate_config.{exc}") from None
        except ImportError:
            pass  # no vLLM here: the engine's start names it
    check_fallback_layout(cfg)
    if not cfg.captures_routes:
        return
    capture = vllm_routes.capture_unavailable() if cfg.generate.backend != "fallback" else None
    if cfg.rl.router_replay:
        reason = capture or router_replay_unavailable()
        if reason:
            raise UserError(f"rl_config.router_replay {cfg.rl.router_replay}: {reason}")
    elif capture:
        raise UserError(f"generate_config.eplb_token_collects: {capture}")


def fallback_reason(cfg: PPOConfig) -> Optional[str]:
    """Why the actor's engines are the megatron-core engine (None: they are vLLM's). Asks the installed vLLM only
    under ``backend: auto``."""
    gen = cfg.generate
    if gen.backend == "fallback":
        return "generate_config.backend is fallback"
    if gen.backend == "vllm":
        return None  # vLLM or a refusal naming why, at the engine's start
    from ...accelerator import get_accelerator
    from ...rollout.engines.vllm_engine import vllm_unusable_reason

    reason = vllm_unusable_reason(cfg.actor.model, gen, get_accelerator().kind, import_vllm=False)
    return f"generate_config.backend auto takes it because {reason}" if reason else None


def check_fallback_layout(cfg: PPOConfig) -> None:
    """The megatron-core engine inside the actor is one whole, unsharded copy of the model on each rank, built in
    the actor's process while megatron's groups are the actor's: at actor TP > 1 its layers would be TP shards and
    at EP > 1 its MoE layers would hold only the rank's own experts, so the full weights the actor exports do not
    fit it (the shapes differ, or the other ranks' experts have no parameter). Refused here, before Ray starts,
    rather than at the first weight update. Rollout workers of their own (``rl_config.rollout_resource``) build it
    in a world of their own and take any actor layout."""
    if cfg.rl.rollout_resource is not None:
        return
    megatron = cfg.actor.megatron
    sharded = {
        "actor_config.tensor_model_parallel_size": megatron.tensor_model_parallel_size,
        "actor_config.expert_model_parallel_size": megatron.expert_model_parallel_size,
    }
    sharded = {key: size for key, size in sharded.items() if size > 1}
    if not sharded:
        return
    reason = fallback_reason(cfg)
    if reason is None:
        return
    key, size = next(iter(sharded.items()))
    raise UserError(
        f"{key} {size}: the rollout would run on the megatron-core engine ({reason}), which holds one whole copy "
        f"of the model per actor rank and cannot load the actor's {key.rsplit('.', 1)[1]} {size} shards; use "
        f"{' and '.join(f'{k} 1' for k in sharded)} with it, rollout workers of their own "
        "(rl_config.rollout_resource), or a vLLM that runs the model (generate_config.backend vllm)"
    )
