"""Captured routes: router replay (rl_config.router_replay) trains with the experts the rollout chose, and EPLB's
expert load (generate_config.eplb_token_collects) counts them; both need the engine to return each token's experts."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def check(cfg: PPOConfig) -> None:
    """Captured routes (router replay, the EPLB expert load) need an MoE actor, routes from vLLM, and (when
    replayed with pipeline stages) no recomputation, which would route a micro-batch again after the next one's
    routes are set."""
    rl, actor = cfg.rl, cfg.actor
    if not cfg.captures_routes:
        return
    key, what = (
        ("rl_config.router_replay", rl.router_replay)
        if rl.router_replay
        else ("generate_config.eplb_token_collects", "true")
    )
    if not actor.model.num_experts:
        raise ConfigError(key, f"{what}, but the actor's model {actor.megatron.model} has no experts")
    if cfg.generate.backend == "fallback" and not cfg.generate.batch_invariant:
        raise ConfigError(
            "generate_config.backend",
            "fallback returns routed experts only with generate_config.batch_invariant true (it re-runs each "
            "prefix, so only batch-invariant numerics give a token one route); or use the vLLM engine",
        )
    if not cfg.generate.enforce_eager:
        raise ConfigError(
            "generate_config.enforce_eager",
            f"false with {key}: the routes are captured by Python at each engine forward, which a captured "
            "CUDA graph would skip; set enforce_eager true",
        )
    if rl.router_replay and actor.megatron.virtual_stages(actor.model.num_layers) > 1:
        raise ConfigError("rl_config.router_replay", "with an interleaved pipeline (VPP): not supported yet")
    if rl.router_replay and actor.pp > 1 and actor.megatron.recompute_granularity:
        raise ConfigError(
            "actor_config.recompute_granularity",
            f"{actor.megatron.recompute_granularity} with PP {actor.pp} and router replay: a recomputed layer would "
            "route again after the next micro-batch's routes are set; turn recomputation off or use PP 1",
        )


def plan_lines(cfg: PPOConfig) -> List[str]:
    gen = cfg.generate
    if not gen.eplb_token_collects:
        return []
    where = gen.eplb_token_save_path or "<run folder>/expert_load.json"
    return [f"  eplb      : tokens per expert and MoE layer counted into {where} (cli/eplb_generate_map.py)"]
