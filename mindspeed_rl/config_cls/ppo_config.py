"""The whole PPO run config: sections, role merging, cross-field rules, the batch plan."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from ..algorithms.registry import AlgorithmChoiceError, AlgorithmPlan, resolve_algorithm
from .base import ConfigError, build_section, closest_key, load_yaml
from .generate_config import GenerateConfig
from .layout import describe_blocks, dp_groups, engine_blocks, layout_diagram
from .megatron_config import MegatronConfig
from .model_config import ModelConfig
from .rl_config import RLConfig

TOP_LEVEL_KEYS = (
    "defaults",
    "model",
    "megatron_training",
    "actor_config",
    "critic_config",
    "rl_config",
    "generate_config",
    "reward_config",
    "dry_run",
    "hydra",
)


@dataclass
class RoleConfig:
    """One Megatron role (actor, critic, reward): its merged training settings and its model."""

    name: str
    megatron: MegatronConfig
    model: ModelConfig
    num_devices: int

    @property
    def tp(self) -> int:
        return self.megatron.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.megatron.pipeline_model_parallel_size

    @property
    def dp(self) -> int:
        return self.num_devices // (self.tp * self.pp)


@dataclass
class PPOConfig:
    megatron_training: MegatronConfig
    actor: RoleConfig
    critic: RoleConfig
    reward: Optional[RoleConfig]
    rl: RLConfig
    generate: GenerateConfig
    dry_run: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    algorithm: Optional[AlgorithmPlan] = None  # resolved from rl_config by check_cross_fields

    @property
    def prompts_per_iteration(self) -> int:
        """Prompt groups trained per iteration: global_batch_size, or filter_groups_train_batch_size when
        dynamic sampling is on (it then draws global_batch_size prompts per generation batch)."""
        rl = self.rl
        if rl.filter_groups_enable and rl.filter_groups_train_batch_size:
            return rl.filter_groups_train_batch_size
        return self.megatron_training.global_batch_size

    @property
    def samples_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.rl.n_samples_per_prompt

    @property
    def uses_critic(self) -> bool:
        return self.algorithm.use_critic

    @property
    def roles(self) -> List[RoleConfig]:
        """The Megatron roles this run starts (the critic only when the advantage estimator needs one)."""
        return [self.actor] + ([self.critic] if self.uses_critic else []) + ([self.reward] if self.reward else [])

    @property
    def training_roles(self) -> List[RoleConfig]:
        """The roles that train, save and resume (the reward model is frozen)."""
        return [self.actor] + ([self.critic] if self.uses_critic else [])

    @property
    def world_size(self) -> int:
        """Devices that count for the throughput metrics (docs/ppo.md, Metrics)."""
        rollout = self.rl.rollout_resource.num_npus if self.rl.rollout_resource is not None else 0
        return self.actor.num_devices + rollout  # integrated: the other roles share the actor's devices


def model_section_data(name: str, models: Mapping[str, Any], config_dir: Optional[str], key: str) -> Mapping:
    if name in models:
        return models[name]
    if config_dir:
        path = os.path.join(config_dir, "model", f"{name}.yaml")
        if os.path.isfile(path):
            data = load_yaml(path) or {}
            return data.get(name, data)
    known = sorted(models)
    if config_dir and os.path.isdir(os.path.join(config_dir, "model")):
        known += sorted(f[:-5] for f in os.listdir(os.path.join(config_dir, "model")) if f.endswith(".yaml"))
    hint = closest_key(name, known)
    raise ConfigError(
        key,
        f"model {name!r} is not defined under `model:` nor as configs/model/{name}.yaml"
        + (f"; did you mean {hint!r}?" if hint else ""),
    )


def build_model_section(data: Mapping, path: str) -> ModelConfig:
    """A model section, checked on its own and against its family (raises ConfigError naming the key)."""
    model = build_section(ModelConfig, data, path)
    model.validate()
    from ..families import get_family  # the families build on ModelConfig: the composition checks them

    get_family(model.model_type_hf).check(model, path)
    return model


def _role(
    name: str,
    section_key: str,
    data: Mapping,
    base: Mapping,
    models: Mapping,
    config_dir: Optional[str],
    num_devices: int,
) -> RoleConfig:
    overrides = data.get(section_key, {})
    build_section(MegatronConfig, overrides, section_key, require=False)  # names the role's own bad keys
    merged = {**base, **overrides}
    where = section_key if "model" in overrides else "megatron_training"
    megatron = build_section(MegatronConfig, merged, where)
    model_name = megatron.model
    model_data = model_section_data(model_name, models, config_dir, f"{where}.model")
    model = build_model_section(model_data, f"model.{model_name}")
    return RoleConfig(name=name, megatron=megatron, model=model, num_devices=num_devices)


def build_ppo_config(data: Mapping[str, Any], config_dir: Optional[str] = None) -> PPOConfig:
    """Validate the composed config mapping and return the typed config (raises ConfigError)."""
    if not isinstance(data, Mapping):
        raise ConfigError("", "the config must be a mapping of sections")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            hint = closest_key(str(key), TOP_LEVEL_KEYS)
            raise ConfigError(str(key), "unknown section" + (f"; did you mean '{hint}'?" if hint else ""))
    models = data.get("model") or {}
    if not isinstance(models, Mapping):
        raise ConfigError("model", "must map model names to their architecture sections")
    base = data.get("megatron_training")
    if not isinstance(base, Mapping):
        raise ConfigError("megatron_training", "required section is missing or not a mapping")
    megatron_training = build_section(MegatronConfig, base, "megatron_training", require=False)
    rl = build_section(RLConfig, data.get("rl_config", {}), "rl_config")
    generate = build_section(GenerateConfig, data.get("generate_config", {}), "generate_config")
    actor = _role("actor", "actor_config", data, base, models, config_dir, rl.actor_resource.num_npus)
    critic = _role("critic", "critic_config", data, base, models, config_dir, rl.critic_resource.num_npus)
    reward = None
    if data.get("reward_config") is not None:
        if rl.reward_resource is None:
            raise ConfigError("rl_config.reward_resource", "required when reward_config is given")
        reward = _role("reward", "reward_config", data, base, models, config_dir, rl.reward_resource.num_npus)
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ConfigError("dry_run", f"got {dry_run!r}, expected true or false")
    cfg = PPOConfig(
        megatron_training=megatron_training,
        actor=actor,
        critic=critic,
        reward=reward,
        rl=rl,
        generate=generate,
        dry_run=dry_run,
        raw=dict(data),
    )
    check_cross_fields(cfg)
    return cfg


def _role_key(role: RoleConfig, name: str) -> str:
    return f"{role.name}_config.{name}" if role.name != "reward" else f"reward_config.{name}"


def check_cross_fields(cfg: PPOConfig) -> None:
    """Rules that involve more than one key. Each error names the key to change."""
    rl, gen = cfg.rl, cfg.generate
    try:
        cfg.algorithm = resolve_algorithm(rl)
    except AlgorithmChoiceError as exc:
        raise ConfigError(exc.key, exc.message) from None
    check_dapo_keys(cfg)
    check_agent_keys(cfg)
    samples = cfg.samples_per_iteration
    if samples % rl.mini_batch_size:
        raise ConfigError(
            "rl_config.mini_batch_size",
            f"{rl.mini_batch_size} does not divide the prompts per iteration x n_samples_per_prompt = "
            f"{cfg.prompts_per_iteration} x {rl.n_samples_per_prompt} = {samples}",
        )
    sampling = cfg.generate.sampling_config
    check_packing_keys(cfg)
    if sampling.min_tokens > sampling.max_tokens:
        raise ConfigError(
            "generate_config.sampling_config.min_tokens",
            f"{sampling.min_tokens} is above max_tokens {sampling.max_tokens}",
        )
    for role in cfg.roles:
        m, model = role.megatron, role.model
        if role.num_devices % (role.tp * role.pp):
            raise ConfigError(
                _role_key(role, "tensor_model_parallel_size"),
                f"TP {role.tp} x PP {role.pp} = {role.tp * role.pp} does not divide the "
                f"{role.name}'s {role.num_devices} devices (rl_config.{role.name}_resource.num_npus)",
            )
        if model.num_attention_heads % role.tp:
            raise ConfigError(
                _role_key(role, "tensor_model_parallel_size"),
                f"TP {role.tp} does not divide num_attention_heads {model.num_attention_heads} of model {m.model}",
            )
        if model.kv_heads % role.tp:
            raise ConfigError(
                _role_key(role, "tensor_model_parallel_size"),
                f"TP {role.tp} does not divide num_query_groups {model.kv_heads} of model {m.model}",
            )
        ep = m.expert_model_parallel_size
        if ep > 1 and not model.num_experts:
            raise ConfigError(
                _role_key(role, "expert_model_parallel_size"),
                f"{ep} needs a mixture-of-experts model; {m.model} is dense",
            )
        if model.num_experts and model.num_experts % ep:
            raise ConfigError(
                _role_key(role, "expert_model_parallel_size"),
                f"EP {ep} does not divide num_experts {model.num_experts} of model {m.model}",
            )
        if role.dp % ep:
            raise ConfigError(
                _role_key(role, "expert_model_parallel_size"),
                f"EP {ep} does not divide the {role.name}'s data-parallel size {role.dp} "
                f"(devices {role.num_devices} / (TP {role.tp} x PP {role.pp}))",
            )
        layers = m.layers_per_stage(model.num_layers)
        if m.num_layer_list:
            if len(layers) != role.pp or sum(layers) != model.num_layers or min(layers) < 1:
                raise ConfigError(
                    _role_key(role, "num_layer_list"),
                    f"{m.num_layer_list!r} must list {role.pp} positive layer counts summing to "
                    f"num_layers {model.num_layers}",
                )
        elif model.num_layers % role.pp:
            raise ConfigError(
                _role_key(role, "pipeline_model_parallel_size"),
                f"PP {role.pp} does not divide num_layers {model.num_layers}; set num_layer_list",
            )
        if role.name != "reward":
            per_rank = rl.mini_batch_size / role.dp
            if rl.mini_batch_size % (m.micro_batch_size * role.dp):
                raise ConfigError(
                    _role_key(role, "micro_batch_size"),
                    f"mini_batch_size {rl.mini_batch_size} over DP {role.dp} gives {per_rank:g} "
                    f"samples per rank, not a multiple of micro_batch_size {m.micro_batch_size}",
                )
        if m.bf16 and m.fp16:
            raise ConfigError(_role_key(role, "fp16"), "bf16 and fp16 are both true; pick one")
        if m.min_lr > m.lr:
            raise ConfigError(_role_key(role, "min_lr"), f"{m.min_lr} is above lr {m.lr}")
        if m.save_hf and not m.save:
            raise ConfigError(
                _role_key(role, "save_hf"),
                "is true but save is not set: the HF folder is written beside each checkpoint in save",
            )
        if m.save_hf and m.no_shared_storage:
            raise ConfigError(
                _role_key(role, "save_hf"),
                "needs a filesystem all ranks share (no_shared_storage is "
                "true): convert afterwards with cli/convert_ckpt.py",
            )
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
    if cfg.actor.model.num_attention_heads % itp or cfg.actor.model.kv_heads % itp:
        raise ConfigError(
            "generate_config.infer_tensor_parallel_size",
            f"{itp} does not divide the heads ({cfg.actor.model.num_attention_heads}) and "
            f"query groups ({cfg.actor.model.kv_heads}) of the actor's model",
        )
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
    if rl.rule_reward:
        from ..rewards.registry import VerifierImportError, import_verifier, is_path, known_verifiers

        known = known_verifiers()
        for i, name in enumerate(rl.verifier_function):
            if is_path(name):
                try:
                    import_verifier(name)
                except VerifierImportError as exc:
                    raise ConfigError(f"rl_config.verifier_function[{i}]", f"{name!r}: {exc}") from None
            elif name not in known:
                hint = closest_key(name, known)
                raise ConfigError(
                    f"rl_config.verifier_function[{i}]",
                    f"unknown verifier {name!r}"
                    + (f"; did you mean {hint!r}?" if hint else "")
                    + f"; registered: {', '.join(sorted(known))}",
                )
    elif cfg.reward is None:
        raise ConfigError(
            "rl_config.rule_reward",
            "false, but no reward_config (reward model) is given: nothing would score the responses",
        )
    if rl.kl_ctrl_type == "adaptive" and (rl.kl_target is None or rl.kl_horizon is None):
        raise ConfigError(
            "rl_config.kl_target" if rl.kl_target is None else "rl_config.kl_horizon",
            "required when kl_ctrl_type is adaptive",
        )
    check_validation_keys(cfg)
    a_save, c_save = cfg.actor.megatron.save, cfg.critic.megatron.save
    if cfg.uses_critic and a_save and c_save and os.path.abspath(a_save) == os.path.abspath(c_save):
        raise ConfigError(
            "critic_config.save", f"{c_save!r} is also the actor's save folder; actor and critic need separate folders"
        )


def validates(cfg: PPOConfig) -> bool:
    return cfg.rl.test_freq > 0 or cfg.rl.val_before_train


def check_packing_keys(cfg: PPOConfig) -> None:
    """Remove padding and token-budget micro-batches: single-stage models only (pipeline stages exchange
    fixed shapes); every budget holds the longest sequence, defaults filled in."""
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
    update_mbs = max(role.megatron.micro_batch_size for role in cfg.roles if role.name != "reward")
    defaults = {
        "ref_max_packing_token_size": rl.ref_forward_micro_batch_size * longest,
        "actor_max_packing_token_size": rl.actor_forward_micro_batch_size * longest,
        "update_max_packing_token_size": update_mbs * longest,
    }
    for key, default in defaults.items():
        value = getattr(rl, key)
        if value is None:
            setattr(rl, key, default)
        elif value < longest:
            raise ConfigError(
                f"rl_config.{key}",
                f"{value} tokens cannot hold the longest sequence: "
                f"max_prompt_length {rl.max_prompt_length} + max_tokens "
                f"{cfg.generate.sampling_config.max_tokens} = {longest}",
            )


def check_validation_keys(cfg: PPOConfig) -> None:
    rl, test = cfg.rl, cfg.actor.megatron.test_data_path
    if validates(cfg) and not test:
        key = "rl_config.test_freq" if rl.test_freq else "rl_config.val_before_train"
        raise ConfigError("megatron_training.test_data_path", f"required by {key}: the preprocessed test set")
    if test and not validates(cfg):
        raise ConfigError(
            "rl_config.test_freq",
            f"is 0 and val_before_train false, so test_data_path {test!r} "
            "would never be used: set test_freq (or val_before_train)",
        )
    if validates(cfg) and not rl.rule_reward:
        raise ConfigError("rl_config.test_freq", "validation scores with the rule verifiers: rule_reward must be true")


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
    """The rollout function resolves; the tool agent has tools, a template with a tool role, and runs
    synchronously."""
    from ..rollout.agent_loop import rollout_function
    from ..tools.registry import ToolConfigError, resolve_tools

    rl = cfg.rl
    name = agent_rollout_function(rl)
    try:
        rollout_function(name)
    except (ValueError, ToolConfigError) as exc:
        raise ConfigError("rl_config.rollout_function", str(exc)) from None
    if name == "single_turn":
        return
    if rl.multi_turn_enable and rl.rollout_function not in ("single_turn", "tool_agent"):
        raise ConfigError(
            "rl_config.multi_turn_enable", f"selects tool_agent, but rollout_function is {rl.rollout_function!r}"
        )
    for key, on in (
        ("partial_rollout_max_split", rl.partial_rollout_max_split > 1),
        ("max_head_offpolicyness", rl.max_head_offpolicyness > 0),
    ):
        if on:
            raise ConfigError(
                f"rl_config.{key}",
                f"cannot be combined with the {name} rollout function yet (multi-turn rollouts run synchronously)",
            )
    if name != "tool_agent":
        return
    try:
        tools = resolve_tools(rl.tools, rl.tool_config_path)
    except ToolConfigError as exc:
        raise ConfigError("rl_config.tools", str(exc)) from None
    if not tools:
        raise ConfigError("rl_config.tools", "the tool_agent rollout needs tools (or a tool_config_path)")
    from ..datasets.templates import load_templates
    from ..rollout.agent_loop import ToolFormat

    templates = load_templates()
    if rl.prompt_type not in templates:
        raise ConfigError("rl_config.prompt_type", f"{rl.prompt_type!r} is not in configs/model/templates.json")
    try:
        ToolFormat.of_template(templates[rl.prompt_type], rl.prompt_type)
    except ValueError as exc:
        raise ConfigError("rl_config.prompt_type", str(exc)) from None


def check_dapo_keys(cfg: PPOConfig) -> None:
    """Dynamic sampling, partial rollout and overlong shaping: keys that only mean something together."""
    rl, max_tokens = cfg.rl, cfg.generate.sampling_config.max_tokens
    if rl.max_head_offpolicyness > 0:
        if rl.rollout_resource is None:
            raise ConfigError(
                "rl_config.max_head_offpolicyness",
                "asynchronous rollout needs rollout workers of their own: set rl_config.rollout_resource",
            )
        if rl.partial_rollout_max_split > 1 or rl.filter_groups_enable:
            raise ConfigError(
                "rl_config.max_head_offpolicyness",
                "asynchronous rollout cannot be combined with partial rollout or dynamic sampling yet",
            )
    if rl.partial_rollout_max_split > 1:
        if rl.filter_groups_enable:
            raise ConfigError(
                "rl_config.partial_rollout_max_split",
                "partial rollout and dynamic sampling (filter_groups_enable) cannot be combined yet",
            )
        if rl.partial_rollout_max_split > max_tokens:
            raise ConfigError(
                "rl_config.partial_rollout_max_split",
                f"{rl.partial_rollout_max_split} chunks of a {max_tokens}-token response would be "
                "empty: at most generate_config.sampling_config.max_tokens",
            )
        chunk = -(-max_tokens // rl.partial_rollout_max_split)
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


def missing_paths(cfg: PPOConfig) -> List[ConfigError]:
    """Files and folders the run needs that do not exist (errors naming their keys)."""
    problems: List[ConfigError] = []
    seen = set()
    for role in cfg.roles:
        m = role.megatron
        checks = [("tokenizer_name_or_path", m.tokenizer_name_or_path, "folder"), ("load", m.load, "folder")]
        if role.name == "actor":
            checks.append(("data_path", m.data_path, "dataset prefix"))
            if m.test_data_path:
                checks.append(("test_data_path", m.test_data_path, "dataset prefix"))
        for key, value, what in checks:
            if key == "load" and value and not m.finetune and not os.path.exists(value):
                continue  # resume from a folder that does not exist yet: fresh start, said in the log
            full = _role_key(role, key) if key in _explicit(cfg, role) else f"megatron_training.{key}"
            if (full, value) in seen:
                continue
            seen.add((full, value))
            if value is None:
                if key in ("tokenizer_name_or_path", "data_path"):
                    problems.append(ConfigError(full, "required to run (not only for dry_run)"))
                continue
            exists = os.path.exists(value) or (what == "dataset prefix" and glob.glob(value + "*"))
            if not exists:
                problems.append(ConfigError(full, f"{what} {value!r} does not exist"))
    ref = cfg.rl.integrated_mode_config.ref_model_load_path
    if ref and not os.path.exists(ref):
        problems.append(
            ConfigError("rl_config.integrated_mode_config.ref_model_load_path", f"folder {ref!r} does not exist")
        )
    return problems


def _explicit(cfg: PPOConfig, role: RoleConfig) -> set:
    section = cfg.raw.get(f"{role.name}_config") or {}
    return set(section) if isinstance(section, Mapping) else set()


def devices_per_node() -> int:
    """Devices of one node as the launcher says (NPUS_PER_NODE), 16 by default (an Atlas A3 node)."""
    value = os.environ.get("NPUS_PER_NODE", "16")
    try:
        return max(1, int(value))
    except ValueError:
        raise ConfigError("NPUS_PER_NODE", f"environment variable must be an integer, got {value!r}") from None


def batch_plan(cfg: PPOConfig) -> str:
    """A human-readable account of how one iteration's samples are split."""
    gbs, n = cfg.prompts_per_iteration, cfg.rl.n_samples_per_prompt
    samples, mini = cfg.samples_per_iteration, cfg.rl.mini_batch_size
    roles = cfg.roles
    per_node = devices_per_node()
    devices = cfg.actor.num_devices
    nodes = -(-devices // per_node)
    node_text = f"{nodes} node{'s' if nodes > 1 else ''} x {min(per_node, devices)}"
    gen = cfg.generate
    itp = gen.infer_tensor_parallel_size
    rollout_devices = cfg.rl.rollout_resource.num_npus if cfg.rl.rollout_resource is not None else 0
    infer_dp = (rollout_devices or devices) // itp
    split = cfg.rl.partial_rollout_max_split
    lines = [
        "Batch plan",
        f"  algorithm : {cfg.algorithm.describe()}",
        f"  iteration : {gbs} prompts x {n} samples = {samples} responses"
        + (
            f" (dynamic sampling: batches of {cfg.megatron_training.global_batch_size} prompts until {gbs} groups "
            f"differ in {filter_metric_name(cfg.rl)}, "
            + (
                f"at most {cfg.rl.filter_groups_max_batches} batch(es))"
                if cfg.rl.filter_groups_max_batches > 0
                else "no batch limit)"
            )
            if cfg.rl.filter_groups_enable
            else ""
        ),
        f"  update    : {samples} / mini_batch_size {mini} = {samples // mini} mini-batches per epoch"
        f" x {cfg.rl.epochs} epoch(s) = {samples // mini * cfg.rl.epochs} optimizer steps per role",
        f"  devices   : {devices} ({node_text}, NPUS_PER_NODE={per_node}), integrated="
        f"{cfg.rl.use_integrated_worker}, throughput world_size={cfg.world_size}",
        f"  rollout   : infer TP {itp} x PP {gen.infer_pipeline_parallel_size}, "
        f"{infer_dp} engine(s), {gbs / infer_dp:g} prompts = {samples / infer_dp:g} responses each, up to "
        f"{gen.sampling_config.max_tokens} new tokens",
        f"  engines   : {describe_blocks(engine_blocks(rollout_devices or devices, itp), 'engine')}"
        + (
            f" (rollout workers on {rollout_devices} devices of their own after the actor's {devices}: disaggregated, "
            "the actor's rank 0 pushes full weights to every rollout rank after each update)"
            if rollout_devices
            else " (actor ranks; every rank of an engine gets the same prompts)"
        ),
    ]
    agent = agent_rollout_function(cfg.rl)
    if agent != "single_turn":
        rl = cfg.rl
        tools = ", ".join(rl.tools) + (f" + {rl.tool_config_path}" if rl.tool_config_path else "")
        lines.append(
            f"  agent     : rollout function {agent}, tools [{tools}], up to {rl.max_turns} turns and "
            f"{rl.max_tool_calls} calls per trajectory within max_tokens; tool results loss_mask 0; "
            f"sandbox {rl.tool_timeout:g} s wall, {rl.tool_cpu_seconds} s CPU, {rl.tool_memory_mb} MB"
        )
    if cfg.rl.max_head_offpolicyness > 0:
        lines.append(
            f"  async     : the rollout workers generate up to {cfg.rl.max_head_offpolicyness} batch(es) "
            "ahead of training (each sampled at most that many versions before it trains)"
        )
    if split > 1:
        lines.append(
            f"  partial   : chunks of {-(-gen.sampling_config.max_tokens // split)} tokens "
            f"(max_tokens / partial_rollout_max_split {split}); unfinished responses are parked and continued "
            f"with the next weights, finished within {split} iterations"
            + ("" if cfg.rl.require_max_age_all_finished else " when rounds run (require_max_age_all_finished false)")
        )
    for role in roles:
        m = role.megatron
        per_rank = mini // role.dp if role.name != "reward" else samples // role.dp
        micro = per_rank // m.micro_batch_size
        params = readable_count(role.model.parameter_count()) + " params"
        if role.model.num_experts:
            params += (
                f", {readable_count(role.model.active_parameter_count())} active; {role.model.num_experts} "
                f"experts over EP {m.expert_model_parallel_size}"
            )
        lines.append(
            f"  {role.name:<10}: {role.num_devices} devices = TP {role.tp} x PP {role.pp} x DP {role.dp}; "
            f"model {m.model} ({params}); "
            + (
                f"{per_rank} samples per DP rank per mini-batch = {micro} micro-batch(es) of {m.micro_batch_size}; "
                f"lr {m.lr:g}"
                if role.name != "reward"
                else f"{per_rank} samples per DP rank to score"
            )
        )
    for role in roles:
        lines.append(
            f"  {role.name + ' DP':<10}: "
            + describe_blocks(dp_groups(role.tp, role.dp, role.pp), "DP")
            + f" (ranks of each {role.name} data-parallel group: TP x PP)"
        )
    lines.append(
        f"  forward   : actor_forward_micro_batch_size {cfg.rl.actor_forward_micro_batch_size}, "
        f"ref_forward_micro_batch_size {cfg.rl.ref_forward_micro_batch_size}"
    )
    co_located = [(r.name, r.tp, r.dp, r.pp) for r in roles if r.num_devices == devices]
    lines.append("  layout (one placement group; roles share the bundles):")
    lines += ["    " + line for line in layout_diagram(devices, itp, co_located).splitlines()]
    return "\n".join(lines)


def readable_count(count: float) -> str:
    """3.4M, 32.8B: three significant digits and a unit."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:g}"


def to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj
