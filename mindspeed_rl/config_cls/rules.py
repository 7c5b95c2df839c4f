"""Cross-key rules of the PPO config: each reads the composed config and raises a ConfigError naming
the key to change; none writes (derived values come from ppo_config.derive)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

from .architecture_rules import check_architecture_features, check_infer_heads
from .base import ConfigError
from .feature_rules import (
    check_agent_keys,
    check_batch_invariant_keys,
    check_dapo_keys,
    check_distillation_keys,
    check_judge_keys,
    check_lora_keys,
    check_packing_keys,
    check_router_replay_keys,
    check_vision_keys,
    role_key,
)
from .logging_config import check_logging_keys
from .megatron_config import STAGE_ENTRY_POINTS
from .memory_rules import check_memory_switches
from .pipeline_rules import check_pipeline_layers
from .precision_rules import check_rollout_precision_keys, check_training_precision_keys

if TYPE_CHECKING:
    from .run_config import PPOConfig, RoleConfig


def ulysses_layout(heads: int, groups: int, cp: int) -> Optional[str]:
    """Why Ulysses cannot split ``heads`` query heads and ``groups`` key/value groups (per TP rank) over CP
    ranks, or None when it can. Key/value groups fewer than CP are repeated (each rank needs one)."""
    if heads % cp:
        return f"{heads} attention heads per TP rank do not split over CP {cp}"
    if groups % cp and cp % groups:
        return f"{groups} query groups per TP rank neither split over CP {cp} nor divide it"
    return None


def check_context_parallel(role: RoleConfig) -> None:
    """Ulysses splits the attention heads over CP: the heads and query groups of a TP rank must allow it."""
    m, model = role.megatron, role.model
    if role.cp > 1 and m.context_parallel_algo == "megatron_cp_algo" and m.lora_r:
        raise ConfigError(
            role_key(role, "context_parallel_algo"),
            "megatron_cp_algo is Transformer Engine's ring attention, and LoRA trains on the local layer spec "
            "without it: use ulysses_cp_algo with lora_r",
        )
    if role.cp == 1 or m.context_parallel_algo != "ulysses_cp_algo":
        return
    if model.num_attention_heads % role.tp or model.kv_heads % role.tp:
        return  # the TP rule names it
    reason = ulysses_layout(model.num_attention_heads // role.tp, model.kv_heads // role.tp, role.cp)
    if reason:
        raise ConfigError(
            role_key(role, "context_parallel_size"),
            f"{role.cp} with ulysses_cp_algo: {reason} (model {m.model}: {model.num_attention_heads} heads, "
            f"{model.kv_heads} query groups, TP {role.tp}); choose a CP size that fits or megatron_cp_algo",
        )


def check_cross_fields(cfg: PPOConfig) -> None:
    """Rules that involve more than one key, by section and feature, in the order their errors are reported.
    Each error names the key to change."""
    check_dapo_keys(cfg)
    check_agent_keys(cfg)
    check_lora_keys(cfg)
    check_router_replay_keys(cfg)
    check_vision_keys(cfg)
    check_batch_invariant_keys(cfg)
    check_rollout_precision_keys(cfg)
    check_batch_sizes(cfg)
    check_packing_keys(cfg)
    check_sampling_keys(cfg)
    for role in cfg.roles:
        check_role_parallelism(role)
        check_role_micro_batch(role, cfg.rl.mini_batch_size)
        check_role_training(role)
    check_worker_modes(cfg)
    check_role_resources(cfg)
    check_rollout_layout(cfg)
    check_sequence_lengths(cfg)
    check_reward_keys(cfg)
    check_distillation_keys(cfg)
    check_judge_keys(cfg)
    check_kl_keys(cfg)
    check_validation_keys(cfg)
    check_save_folders(cfg)
    check_logging_keys(cfg.rl)


def check_batch_sizes(cfg: PPOConfig) -> None:
    """The mini-batch divides one iteration's responses."""
    rl = cfg.rl
    samples = cfg.samples_per_iteration
    if samples % rl.mini_batch_size:
        raise ConfigError(
            "rl_config.mini_batch_size",
            f"{rl.mini_batch_size} does not divide the prompts per iteration x n_samples_per_prompt = "
            f"{cfg.prompts_per_iteration} x {rl.n_samples_per_prompt} = {samples}",
        )


def check_sampling_keys(cfg: PPOConfig) -> None:
    sampling = cfg.generate.sampling_config
    if sampling.min_tokens > sampling.max_tokens:
        raise ConfigError(
            "generate_config.sampling_config.min_tokens",
            f"{sampling.min_tokens} is above max_tokens {sampling.max_tokens}",
        )


def check_role_parallelism(role: RoleConfig) -> None:
    """TP x PP x CP divides the role's devices, TP the heads, EP the experts and DP, PP the layers."""
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
    check_context_parallel(role)
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
    check_pipeline_layers(role)
    check_architecture_features(role)


def check_role_micro_batch(role: RoleConfig, mini_batch_size: int) -> None:
    """A training role's share of a mini-batch is whole micro-batches."""
    m = role.megatron
    if role.trains:
        per_rank = mini_batch_size / role.dp
        if mini_batch_size % (m.micro_batch_size * role.dp):
            raise ConfigError(
                role_key(role, "micro_batch_size"),
                f"mini_batch_size {mini_batch_size} over DP {role.dp} gives {per_rank:g} "
                f"samples per rank, not a multiple of micro_batch_size {m.micro_batch_size}",
            )
        micro = mini_batch_size // (m.micro_batch_size * role.dp)
        if m.virtual_stages(role.model.num_layers) > 1 and micro % role.pp:
            raise ConfigError(
                role_key(role, "micro_batch_size"),
                f"{micro} micro-batches per mini-batch and rank; an interleaved pipeline (VPP) runs a multiple of "
                f"PP {role.pp}",
            )


def check_role_training(role: RoleConfig) -> None:
    """Precision, learning-rate floor, HF copies of checkpoints, recomputation and MindSpeed's switches."""
    m = role.megatron
    check_memory_switches(role)
    check_training_precision_keys(role)
    if m.min_lr > m.lr:
        raise ConfigError(role_key(role, "min_lr"), f"{m.min_lr} is above lr {m.lr}")
    if m.save_hf and not m.save:
        raise ConfigError(
            role_key(role, "save_hf"),
            "is true but save is not set: the HF folder is written beside each checkpoint in save",
        )
    if m.save_hf and m.no_shared_storage:
        raise ConfigError(
            role_key(role, "save_hf"),
            "needs a filesystem all ranks share (no_shared_storage is "
            "true): convert afterwards with cli/convert_ckpt.py",
        )


def check_worker_modes(cfg: PPOConfig) -> None:
    """MindSpeed-RL switches we name but do not implement."""
    rl = cfg.rl
    stage = cfg.megatron_training.stage
    if stage in STAGE_ENTRY_POINTS:
        raise ConfigError("megatron_training.stage", f"{stage} is {STAGE_ENTRY_POINTS[stage]}")
    if not rl.use_integrated_worker:
        raise ConfigError(
            "rl_config.use_integrated_worker",
            "false (actor, reference and critic in workers on devices "
            "of their own) is not implemented: the roles share the "
            "actor's devices; for rollout on devices of its own set "
            "rl_config.rollout_resource",
        )
    if not rl.blocking:
        raise ConfigError(
            "rl_config.blocking",
            "false is not implemented: the stages of an iteration run one after "
            "the other; to overlap generation with training use "
            "rl_config.max_head_offpolicyness (asynchronous rollout)",
        )


def check_role_resources(cfg: PPOConfig) -> None:
    """The frozen roles' weights, and the roles that share the actor's devices fit on them."""
    if cfg.teacher is not None:
        if not cfg.teacher.megatron.load:
            raise ConfigError(
                "teacher_config.load",
                "required: the teacher's weights (an mcore checkpoint: a trained run's save folder, or an HF model "
                "converted with cli/convert_ckpt.py)",
            )
        if cfg.rl.teacher_colocate and cfg.teacher.num_devices > cfg.actor.num_devices:
            raise ConfigError(
                "rl_config.teacher_resource.num_npus",
                f"{cfg.teacher.num_devices} exceeds actor_resource.num_npus {cfg.actor.num_devices}: a colocated "
                "teacher shares the actor's devices; set rl_config.teacher_colocate false to give it its own",
            )
    if cfg.reward is not None:
        if not cfg.reward.megatron.load:
            raise ConfigError(
                "reward_config.load",
                "required: the reward model's weights (a checkpoint converted with cli/convert_ckpt.py --orm)",
            )
        if cfg.reward.num_devices > cfg.actor.num_devices:
            raise ConfigError(
                "rl_config.reward_resource.num_npus",
                f"{cfg.reward.num_devices} exceeds actor_resource.num_npus {cfg.actor.num_devices}: "
                "in integrated mode the reward model shares the actor's devices",
            )
    if cfg.uses_critic and cfg.critic.num_devices > cfg.actor.num_devices:
        raise ConfigError(
            "rl_config.critic_resource.num_npus",
            f"{cfg.critic.num_devices} exceeds actor_resource.num_npus {cfg.actor.num_devices}: "
            "in integrated mode the critic shares the actor's devices",
        )


def check_rollout_layout(cfg: PPOConfig) -> None:
    """Infer TP against the devices and the model; how weights reach rollout workers."""
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
    check_infer_heads(cfg.actor.model, itp)


def check_sequence_lengths(cfg: PPOConfig) -> None:
    """Prompt + response fits training's seq_length, the engine's max_model_len and the model's positions."""
    rl, gen = cfg.rl, cfg.generate
    seq_length = cfg.megatron_training.seq_length
    if seq_length is not None and rl.max_prompt_length > seq_length:
        raise ConfigError(
            "rl_config.max_prompt_length", f"{rl.max_prompt_length} exceeds megatron_training.seq_length {seq_length}"
        )
    needed = rl.max_prompt_length + gen.sampling_config.max_tokens
    if seq_length is not None and needed > seq_length:
        raise ConfigError(
            "megatron_training.seq_length",
            f"{seq_length} is below rl_config.max_prompt_length + sampling_config.max_tokens = {needed}, "
            "the longest sequence training sees",
        )
    if needed > gen.max_model_len:
        raise ConfigError(
            "generate_config.max_model_len",
            f"{gen.max_model_len} is below rl_config.max_prompt_length + sampling_config.max_tokens = {needed}",
        )
    positions = cfg.actor.model.max_position_embeddings
    if positions is not None and gen.max_model_len > positions:
        raise ConfigError(
            "generate_config.max_model_len",
            f"{gen.max_model_len} exceeds the actor model's max_position_embeddings {positions}: "
            "vLLM refuses it (lower max_model_len)",
        )
    if gen.max_num_batched_tokens < gen.max_model_len and gen.max_num_batched_tokens < rl.max_prompt_length:
        raise ConfigError(
            "generate_config.max_num_batched_tokens",
            f"{gen.max_num_batched_tokens} cannot hold one prompt of max_prompt_length {rl.max_prompt_length}",
        )


def check_reward_keys(cfg: PPOConfig) -> None:
    """Something scores the responses: verifiers (with weights; their names resolve in
    trainer/config_names.py), or a reward model."""
    rl = cfg.rl
    if rl.rule_reward and not rl.verifier_function:
        raise ConfigError(
            "rl_config.verifier_function",
            "is empty but rule_reward is true: name at least one "
            "verifier, or set rule_reward false and give a reward_config",
        )
    if len(rl.verifier_function) != len(rl.verifier_weight):
        raise ConfigError(
            "rl_config.verifier_weight",
            f"{len(rl.verifier_weight)} weights for {len(rl.verifier_function)} verifier functions "
            f"{rl.verifier_function}",
        )
    if not rl.rule_reward and cfg.reward is None and cfg.judge is None and not rl.distill_coef:
        raise ConfigError(
            "rl_config.rule_reward",
            "false, but no reward_config (reward model) nor judge_config is given: nothing would score the responses",
        )


def check_kl_keys(cfg: PPOConfig) -> None:
    rl = cfg.rl
    if rl.kl_ctrl_type == "adaptive" and (rl.kl_target is None or rl.kl_horizon is None):
        raise ConfigError(
            "rl_config.kl_target" if rl.kl_target is None else "rl_config.kl_horizon",
            "required when kl_ctrl_type is adaptive",
        )


def check_save_folders(cfg: PPOConfig) -> None:
    a_save, c_save = cfg.actor.megatron.save, cfg.critic.megatron.save
    if cfg.uses_critic and a_save and c_save and os.path.abspath(a_save) == os.path.abspath(c_save):
        raise ConfigError(
            "critic_config.save", f"{c_save!r} is also the actor's save folder; actor and critic need separate folders"
        )


# what the batch plans say when a test set is configured but validation is off: one key switches it off
VALIDATION_OFF = "off (rl_config.test_freq 0): test_data_path {path!r} is not read, val_before_train does nothing"


def validates(cfg: PPOConfig) -> bool:
    """Validation is on: rl_config.test_freq > 0 (then also before training with val_before_train)."""
    return cfg.rl.test_freq > 0


def check_validation_keys(cfg: PPOConfig) -> None:
    rl, test = cfg.rl, cfg.actor.megatron.test_data_path
    if validates(cfg) and not test:
        raise ConfigError(
            "megatron_training.test_data_path", "required by rl_config.test_freq: the preprocessed test set"
        )
    if validates(cfg) and not rl.rule_reward:
        raise ConfigError("rl_config.test_freq", "validation scores with the rule verifiers: rule_reward must be true")
