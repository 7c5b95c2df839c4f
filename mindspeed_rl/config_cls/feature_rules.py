"""Rules of single features (packing, the agent rollout, DAPO's dynamic sampling and partial rollout, LoRA,
distillation, router replay, the zero-difference mode) and the names they resolve (filter_metric_name,
agent_rollout_function)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from .base import ConfigError

if TYPE_CHECKING:
    from .rl_config import RLConfig
    from .run_config import PPOConfig, RoleConfig


def role_key(role: RoleConfig, name: str) -> str:
    return f"{role.name}_config.{name}"


def partial_chunk(max_tokens: int, max_split: int) -> int:
    """Tokens a trajectory grows per round under partial rollout: ceil(max_tokens / partial_rollout_max_split)."""
    return -(-max_tokens // max_split)


def check_packing_keys(cfg: PPOConfig) -> None:
    """Remove padding and token-budget micro-batches: single-stage models only (pipeline stages exchange
    fixed shapes); every budget holds the longest sequence (derive fills in the defaults)."""
    rl = cfg.rl
    if not rl.use_dynamic_bsz:
        for key in ("ref_max_packing_token_size", "actor_max_packing_token_size", "update_max_packing_token_size"):
            if getattr(rl, key) is not None:
                raise ConfigError(f"rl_config.{key}", "is set but use_dynamic_bsz is false")
    if not (rl.use_remove_padding or rl.use_dynamic_bsz):
        return
    for role in cfg.roles:
        if role.pp > 1:
            key = "use_remove_padding" if rl.use_remove_padding else "use_dynamic_bsz"
            raise ConfigError(
                f"rl_config.{key}",
                f"needs pipeline_model_parallel_size 1; the {role.name} has PP "
                f"{role.pp} (stages exchange fixed-shape activations)",
            )
    if not rl.use_dynamic_bsz:
        return
    longest = rl.max_prompt_length + cfg.generate.sampling_config.max_tokens
    for key in ("ref_max_packing_token_size", "actor_max_packing_token_size", "update_max_packing_token_size"):
        value = getattr(rl, key)
        if value < longest:
            raise ConfigError(
                f"rl_config.{key}",
                f"{value} tokens cannot hold the longest sequence: "
                f"max_prompt_length {rl.max_prompt_length} + max_tokens "
                f"{cfg.generate.sampling_config.max_tokens} = {longest}",
            )


def filter_metric_name(rl: RLConfig) -> str:
    """The per-row value dynamic sampling compares inside a group: "score" or a verifier's name."""
    metric = rl.filter_groups_metric
    if metric is None:
        return rl.verifier_function[0] if rl.rule_reward and rl.verifier_function else "score"
    match = re.fullmatch(r"(?:\w+/)?(\w+)_rewards/mean", metric)  # MindSpeed-RL: grpo/<verifier>_rewards/mean
    return match.group(1) if match else metric


def agent_rollout_function(rl) -> str:
    """The rollout function in effect (MindSpeed-RL's multi_turn_enable selects tool_agent)."""
    return "tool_agent" if rl.multi_turn_enable and rl.rollout_function == "single_turn" else rl.rollout_function


def check_agent_keys(cfg: PPOConfig) -> None:
    """multi_turn_enable selects the tool agent, so it cannot be combined with another rollout function (the
    names themselves resolve in trainer/config_names.py)."""
    rl = cfg.rl
    if rl.multi_turn_enable and rl.rollout_function not in ("single_turn", "tool_agent"):
        raise ConfigError(
            "rl_config.multi_turn_enable", f"selects tool_agent, but rollout_function is {rl.rollout_function!r}"
        )


MAX_HEAD_OFFPOLICYNESS = 8
"""The most batches asynchronous rollout may generate ahead (docs/rollout.md): the L + 1 batches in flight are
held by the driver, waited for and stored by every checkpoint, and the first weight push queues behind L of
them."""


def check_async_lag(lag: int, train_iters: int) -> None:
    """max_head_offpolicyness L: the first iteration submits L + 1 batches, which must be batches of the run
    (L < train_iters) and few enough to hold (L <= MAX_HEAD_OFFPOLICYNESS)."""
    if lag > MAX_HEAD_OFFPOLICYNESS:
        raise ConfigError(
            "rl_config.max_head_offpolicyness",
            f"{lag} is above {MAX_HEAD_OFFPOLICYNESS}: the rollout workers would generate {lag + 1} batches before "
            "the first weight update reaches them, and every checkpoint waits for and stores all of them "
            "(AReaL's examples use 2 to 4)",
        )
    if lag >= train_iters:
        raise ConfigError(
            "rl_config.max_head_offpolicyness",
            f"{lag} is not below megatron_training.train_iters {train_iters}: the first iteration would submit "
            f"{lag + 1} batches, more than the run's {train_iters} iterations train on: at most {train_iters - 1}",
        )


def check_dapo_keys(cfg: PPOConfig) -> None:
    """Dynamic sampling, partial rollout and overlong shaping: keys that only mean something together."""
    rl, max_tokens = cfg.rl, cfg.generate.sampling_config.max_tokens
    if rl.max_head_offpolicyness > 0:
        if rl.rollout_resource is None:
            raise ConfigError(
                "rl_config.max_head_offpolicyness",
                "asynchronous rollout needs rollout workers of their own: set rl_config.rollout_resource",
            )
        check_async_lag(rl.max_head_offpolicyness, cfg.megatron_training.train_iters)
    if rl.partial_rollout_max_split > 1:
        if rl.partial_rollout_max_split > max_tokens:
            raise ConfigError(
                "rl_config.partial_rollout_max_split",
                f"{rl.partial_rollout_max_split} chunks of a {max_tokens}-token response would be "
                "empty: at most generate_config.sampling_config.max_tokens",
            )
        chunk = partial_chunk(max_tokens, rl.partial_rollout_max_split)
        if cfg.generate.sampling_config.min_tokens > chunk:
            raise ConfigError(
                "generate_config.sampling_config.min_tokens",
                f"{cfg.generate.sampling_config.min_tokens} is above the partial-rollout chunk of "
                f"{chunk} tokens (max_tokens / partial_rollout_max_split)",
            )
    if not rl.filter_groups_enable:
        for key in ("filter_groups_metric", "filter_groups_train_batch_size"):
            if getattr(rl, key) is not None:
                raise ConfigError(f"rl_config.{key}", "is set but filter_groups_enable is false")
    else:
        if rl.n_samples_per_prompt < 2:
            raise ConfigError(
                "rl_config.n_samples_per_prompt",
                "filter_groups_enable compares the responses of one prompt: it needs at least 2 samples per prompt",
            )
        if rl.filter_groups_max_batches == 0:
            raise ConfigError("rl_config.filter_groups_max_batches", "0 would generate nothing; -1 means no limit")
        wanted, batch = rl.filter_groups_train_batch_size, cfg.megatron_training.global_batch_size
        if wanted and rl.filter_groups_max_batches > 0 and wanted > rl.filter_groups_max_batches * batch:
            raise ConfigError(
                "rl_config.filter_groups_train_batch_size",
                f"{wanted} groups can never be filled: at most filter_groups_max_batches "
                f"{rl.filter_groups_max_batches} x megatron_training.global_batch_size {batch} = "
                f"{rl.filter_groups_max_batches * batch} groups are drawn per iteration",
            )
        metric = filter_metric_name(rl)
        known = ["score"] + (list(rl.verifier_function) if rl.rule_reward else [])
        if metric not in known:
            raise ConfigError(
                "rl_config.filter_groups_metric",
                f"{rl.filter_groups_metric!r} is neither score nor a verifier of verifier_function "
                f"({', '.join(known)})",
            )
    if rl.overlong_buffer_enable:
        length = rl.rollout_max_tokens or max_tokens
        if rl.overlong_buffer < 1 or rl.overlong_buffer >= length:
            raise ConfigError(
                "rl_config.overlong_buffer",
                f"{rl.overlong_buffer} must be between 1 and rollout_max_tokens - 1 = {length - 1}",
            )
        if rl.rollout_max_tokens is not None and rl.rollout_max_tokens > max_tokens:
            raise ConfigError(
                "rl_config.rollout_max_tokens",
                f"{rl.rollout_max_tokens} exceeds generate_config.sampling_config.max_tokens "
                f"{max_tokens}: no response can be that long",
            )


LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def check_lora_keys(cfg: PPOConfig) -> None:
    """LoRA trains adapters on the named layers of a training role (a frozen reward model ignores it); with it
    the reference is the actor's own base weights (adapters off), so no other reference folder can be given."""
    for role in cfg.roles:
        m, section = role.megatron, f"{role.name}_config"
        unknown = [t for t in m.lora_target_modules if t not in LORA_TARGETS]
        if unknown or (m.lora_r and not m.lora_target_modules):
            raise ConfigError(
                f"{section}.lora_target_modules",
                f"{unknown or 'empty'}: choose among {', '.join(LORA_TARGETS)}",
            )

    for role in cfg.training_roles:
        check_lora_rank(role)
    if cfg.actor.megatron.lora_r and cfg.rl.integrated_mode_config.ref_model_load_path:
        raise ConfigError(
            "rl_config.integrated_mode_config.ref_model_load_path",
            "with actor_config.lora_r > 0 the reference is the actor's base weights (adapters off); remove it",
        )


def check_lora_rank(role: RoleConfig) -> None:
    """An adapter's rank above min(in, out) of the full weight it adapts adds parameters and no expressive
    power (B A already has full rank at min(in, out)); the tightest target layer names the bound."""
    m = role.megatron
    if not m.lora_r:
        return
    shapes = role.model.lora_layer_shapes()
    targets = [t for t in m.lora_target_modules if t in shapes]
    if not targets:
        return
    name = min(targets, key=lambda t: min(shapes[t][1:3]))
    _, fan_in, fan_out, experts = shapes[name]
    bound = min(fan_in, fan_out)
    if m.lora_r > bound:
        layer = f"{name} of each expert" if experts else name
        raise ConfigError(
            f"{role.name}_config.lora_r",
            f"{m.lora_r} exceeds the smaller dimension of {layer} in model {m.model} (weight [out {fan_out}, "
            f"in {fan_in}], un-sharded): the rank must be at most {bound}",
        )


def check_router_replay_keys(cfg: PPOConfig) -> None:
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


def check_vision_keys(cfg: PPOConfig) -> None:
    """A vision-language actor's 3D rotary positions: no CP split of image tokens, DeepStack's layers on the first
    stage and never replayed by a full recompute; its prompts' images need vLLM to generate."""
    if not cfg.actor.model.vision_config:
        return
    model = cfg.actor.megatron.model
    for role in (r for r in cfg.roles if r.model.vision_config):
        if role.cp > 1:
            raise ConfigError(
                role_key(role, "context_parallel_size"),
                f"{role.cp}: the {role.name} is a vision-language model ({model}), whose image tokens a CP split "
                "would separate from their 3D positions; use 1",
            )
        check_deepstack(role, model)
    if cfg.generate.backend == "fallback":
        raise ConfigError(
            "generate_config.backend",
            f"fallback generates from text only; {model} takes images: use vllm (or auto with vLLM installed)",
        )


def check_deepstack(role: RoleConfig, model: str) -> None:
    """DeepStack (Qwen3-VL) adds image features to the outputs of the first k language-model layers, during the
    forward: those layers sit with the tower on the first pipeline stage, and are not replayed by full recompute."""
    k = len((role.model.vision_config or {}).get("deepstack_visual_indexes") or ())
    if not k:
        return
    if role.megatron.recompute_granularity == "full":
        raise ConfigError(
            role_key(role, "recompute_granularity"),
            f"full: {model}'s DeepStack adds image features to the first {k} layer(s) during the forward, which a full "
            "recompute would replay without them; use selective",
        )
    try:
        first = role.megatron.layers_per_stage(role.model.num_layers)[0]
    except ValueError:
        return  # a malformed num_layer_list: the parallel rules name it
    if first < k:
        raise ConfigError(
            role_key(role, "pipeline_model_parallel_size"),
            f"{role.pp}: the first stage holds {first} layers but {model}'s DeepStack feeds the first {k} (with the "
            "tower on that stage); give the first stage more layers or use a smaller PP",
        )


def check_batch_invariant_keys(cfg: PPOConfig) -> None:
    """The zero-difference mode: the megatron-core engine on both sides, packed forwards, one full copy's
    reductions (no TP or CP split), the same weights (no LoRA adapters computed apart)."""
    if not cfg.generate.batch_invariant:
        return
    actor, why = cfg.actor, "with generate_config.batch_invariant"
    if cfg.generate.backend != "fallback":
        raise ConfigError(
            "generate_config.backend",
            f"{cfg.generate.backend} {why}: only the megatron-core engine (fallback) computes as the trainer does; "
            "vLLM's kernels are its own (rollout/logprob_diff_* and logprob_exact_share measure how close they get)",
        )
    if not cfg.rl.use_remove_padding:
        raise ConfigError(
            "rl_config.use_remove_padding",
            f"false {why}: the padded attention path is not batch-invariant; set it true (packed forwards)",
        )
    for key, size in (
        ("tensor_model_parallel_size", actor.tp),
        ("context_parallel_size", actor.megatron.context_parallel_size),
    ):
        if size > 1:
            raise ConfigError(
                f"actor_config.{key}",
                f"{size} {why}: the rollout engine is one full copy, and a split changes the sums' order; use 1",
            )
    if actor.megatron.lora_r:
        raise ConfigError(
            "actor_config.lora_r",
            f"{actor.megatron.lora_r} {why}: the rollout's merged weights round otherwise "
            "than the adapters computed apart; use 0",
        )


def check_distillation_keys(cfg: PPOConfig) -> None:
    """A teacher exactly when distillation is on; pure distillation (no reward) trains no critic."""
    rl = cfg.rl
    if rl.distill_coef and cfg.teacher is None:
        raise ConfigError(
            "rl_config.distill_coef",
            f"{rl.distill_coef:g} needs a teacher: give teacher_config (and rl_config.teacher_resource)",
        )
    if cfg.teacher is not None and not rl.distill_coef:
        raise ConfigError(
            "rl_config.distill_coef",
            "is 0 but teacher_config is given: the teacher would score nothing; set distill_coef > 0 "
            "(1.0: the teacher's signal at full weight) or remove teacher_config",
        )
    if cfg.teacher is not None and cfg.samples_per_iteration % cfg.teacher.dp:
        raise ConfigError(
            "rl_config.teacher_resource.num_npus",
            f"the teacher's DP {cfg.teacher.dp} does not divide the {cfg.samples_per_iteration} responses of an "
            "iteration it scores",
        )
    saves, teacher_load = cfg.actor.megatron.save, cfg.teacher.megatron.load if cfg.teacher is not None else None
    if saves and teacher_load and os.path.abspath(saves) == os.path.abspath(teacher_load):
        raise ConfigError(
            "actor_config.save",
            f"{saves!r} is the teacher's load folder: the student's checkpoints would overwrite the teacher; "
            "save the student elsewhere",
        )
    rewarded = (rl.rule_reward and any(rl.verifier_weight)) or cfg.reward is not None
    if rl.distill_coef and not rewarded and cfg.uses_critic:
        raise ConfigError(
            "rl_config.adv_estimator",
            f"{rl.adv_estimator} trains a critic on the rewards, and nothing rewards this run (pure distillation): "
            "use a critic-free estimator (grpo, rloo, reinforce_plus_plus), or give a reward",
        )


def check_judge_keys(cfg: PPOConfig) -> None:
    """The judge's devices exactly with its own engines, split into whole engines; a template that shows the
    judge the response."""
    judge, resource = cfg.judge, cfg.rl.judge_resource
    if judge is None or judge.serve == "http":
        if resource is not None and judge is None:
            raise ConfigError(
                "rl_config.judge_resource", "is set but no judge_config: nothing would run on those devices"
            )
        if judge is None:
            return
        if resource is not None:  # the engines' devices, unused over http (said in the plan; no bundles are made)
            judge.unused = [*judge.unused, "rl_config.judge_resource"]
    elif resource is None:
        raise ConfigError("rl_config.judge_resource", "required with judge_config.serve engines: its devices")
    elif resource.num_npus % judge.infer_tensor_parallel_size:
        raise ConfigError(
            "judge_config.infer_tensor_parallel_size",
            f"{judge.infer_tensor_parallel_size} does not divide rl_config.judge_resource.num_npus {resource.num_npus}",
        )
    if judge.template is not None and "{response}" not in judge.template:
        raise ConfigError("judge_config.template", "has no {response}: the judge would not see what it grades")
