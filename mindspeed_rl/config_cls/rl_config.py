"""The ``rl_config`` section: PPO algorithm, rewards, resources, logging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional

from .agent_config import AgentConfig, SandboxConfig, deprecation_note, nest_flat_keys
from .algorithm_choice import ADVANTAGE_ESTIMATORS, DISTILL_SIGNALS, LOSS_AGG_MODES, POLICY_LOSSES, kl_names
from .async_config import AsyncTrainingConfig
from .base import build_section, opt
from .endpoint_config import PolicyEndpointConfig
from .fault_config import RolloutFaultToleranceConfig
from .logging_config import LoggingKeys


@dataclass
class ResourceConfig:
    """Devices given to one role."""

    num_npus: int = opt(doc="Devices (NPUs, GPUs, or CPU slots on CPU) for this role.", ge=1)


@dataclass
class IntegratedModeConfig:
    """Integrated (co-located) mode options."""

    ref_model_load_path: Optional[str] = opt(
        None, "Load the reference model from this checkpoint instead of the actor's initial weights."
    )


@dataclass
class RolloutCorrectionConfig:
    """Truncated importance sampling between the rollout engine's and the trainer's log-probs."""

    rollout_is: Optional[str] = opt(
        None,
        "Reweight the policy loss by min(pi_old / pi_rollout, threshold): per "
        "token, per sequence (the product of its token ratios), or off (off; null: token under "
        "generate_config.rollout_quantization, else off).",
        choices=("token", "sequence", "off"),
    )
    rollout_is_threshold: float = opt(2.0, "The cap of the importance weights.", gt=0)


@dataclass
class ValKwargsConfig:
    """Sampling of the validation responses (verl's val_kwargs); max_tokens is sampling_config's."""

    n: int = opt(1, "Responses per test prompt (N of mean@N and pass@N).", ge=1)
    temperature: float = opt(0.0, "Sampling temperature of validation (0: greedy).", ge=0)
    top_p: float = opt(1.0, "Nucleus sampling mass of validation.", gt=0, le=1)


@dataclass
class RLConfig(LoggingKeys):
    """PPO iteration, advantage and loss settings, rewards, resources and logging."""

    # orchestration
    guarantee_order: bool = opt(
        False,
        "MindSpeed-RL's switch for keeping samples in prompt order: here they "
        "always are (responses are regrouped by prompt), true or false.",
    )
    use_integrated_worker: bool = opt(
        True,
        "Actor, rollout engine and reference share one worker per rank, "
        "and the critic sits on the same devices (false is refused: not "
        "implemented).",
    )
    blocking: bool = opt(
        True,
        "false: the critic's forward and update run beside the actor's worker's (on CPU each with part of the "
        "cores); true: each stage in turn. Generation beside training: max_head_offpolicyness.",
    )
    num_cpus_for_local_task: float = opt(
        1.0,
        "CPUs for the driver's local work: the number of rule-reward verifier processes (rounded down, at least 1).",
        gt=0,
    )
    actor_resource: ResourceConfig = opt(doc="Devices of the actor group.", factory=lambda: ResourceConfig(1))
    critic_resource: ResourceConfig = opt(doc="Devices of the critic group.", factory=lambda: ResourceConfig(1))
    reward_resource: Optional[ResourceConfig] = opt(None, "Devices of the reward-model group (ORM).")
    teacher_resource: Optional[ResourceConfig] = opt(
        None, "Devices of the distillation teacher group (teacher_config; required with it)."
    )
    teacher_colocate: bool = opt(
        True,
        "true: the teacher shares the actor's devices (its weights wait on host between its forwards where the "
        "device offloads); false: devices of its own, after the actor's and the rollout workers'.",
    )
    judge_resource: Optional[ResourceConfig] = opt(
        None,
        "Devices of the generative judge's own vLLM engines (judge_config.serve engines), after the actor's, the "
        "rollout workers' and a teacher's of its own.",
    )
    rollout_resource: Optional[ResourceConfig] = opt(
        None,
        "Disaggregated layout: rollout workers on this many "
        "devices of their own; the actor has no engine and "
        "pushes its weights to them after every update. "
        "null: the actor's own engines (integrated).",
    )
    integrated_mode_config: IntegratedModeConfig = opt(doc="Integrated-mode options.", factory=IntegratedModeConfig)
    # batch split
    n_samples_per_prompt: int = opt(1, "Responses sampled per prompt.", ge=1)
    mini_batch_size: int = opt(
        1, "Responses per optimizer step; global_batch_size x n_samples_per_prompt must be a multiple.", ge=1
    )
    epochs: int = opt(1, "Passes over the experience of one iteration.", ge=1)
    shuffle_mini_batch: bool = opt(False, "Shuffle samples before splitting into mini-batches.")
    actor_forward_micro_batch_size: int = opt(1, "Samples per no-grad actor forward (old log-probs).", ge=1)
    ref_forward_micro_batch_size: int = opt(1, "Samples per reference forward.", ge=1)
    # computing on valid tokens only (models/packing.py, docs/performance.md)
    use_remove_padding: bool = opt(
        False,
        "Forwards and updates run on the valid tokens only: each micro-batch's "
        "rows packed into one sequence (positions restart per row, block-diagonal "
        "causal attention). Results equal the padded path.",
    )
    use_dynamic_bsz: bool = opt(
        False,
        "Micro-batches by a token budget instead of a row count: rows sorted by "
        "length and grouped up to *_max_packing_token_size tokens (packed: the sum "
        "of lengths; padded: rows x the longest). The loss normalisation is the "
        "mini-batch's, so the gradient does not depend on the split.",
    )
    ref_max_packing_token_size: Optional[int] = opt(
        None,
        "Token budget of a reference (and reward model) "
        "forward micro-batch with use_dynamic_bsz (default: "
        "ref_forward_micro_batch_size x the longest sequence).",
        ge=1,
    )
    actor_max_packing_token_size: Optional[int] = opt(
        None,
        "Token budget of an old-log-prob or critic-value "
        "forward micro-batch with use_dynamic_bsz (default: "
        "actor_forward_micro_batch_size x the longest "
        "sequence).",
        ge=1,
    )
    update_max_packing_token_size: Optional[int] = opt(
        None,
        "Token budget of a training micro-batch (actor and "
        "critic) with use_dynamic_bsz (default: the role's "
        "micro_batch_size x the longest sequence).",
        ge=1,
    )
    use_dp_batch_balance: bool = opt(
        False,
        "Hand data-parallel ranks equal row counts with near-equal token sums "
        "(longest rows first to the least-loaded rank) instead of contiguous "
        "slices.",
    )
    max_prompt_length: int = opt(2048, "Prompts longer than this (tokens) are dropped at load.", ge=1)
    max_nonfinite_steps: int = opt(
        3,
        "Consecutive optimizer steps of one role skipped for a NaN/Inf loss or "
        "gradient after which the run stops with exit code 3 (each skipped step "
        "is counted in <role>/skipped_steps).",
        ge=1,
    )
    max_restarts: int = opt(
        0,
        "Runs that heal themselves: when a worker process dies (exit code 4 otherwise), "
        "the driver restarts every worker group and resumes from the last checkpoint all "
        "roles completed (optimizer and RNG included), up to this many times per run; each "
        "restart is printed. 0: stop at the first dead worker.",
        ge=0,
    )
    max_collapsed_iterations: int = opt(
        3,
        "Consecutive iterations with a collapsed policy (actor entropy below "
        "1e-4 and gradient norm below 1e-8: nothing left to learn, e.g. after a "
        "too large lr) after which the run stops with exit code 3; collapsed "
        "iterations are not saved, so the last checkpoint is the one before, and "
        "a run whose last iteration looks collapsed also ends with exit code 3. "
        "0 turns the guard off.",
        ge=0,
    )
    # advantages and KL
    adv_estimator: str = opt(
        "gae",
        "Advantage estimator (docs/algorithms.md): gae needs a critic; the group "
        "estimators need n_samples_per_prompt >= 2.",
        choices=tuple(ADVANTAGE_ESTIMATORS),
    )
    gamma: float = opt(1.0, "Discount (gae, reinforce_plus_plus).", ge=0, le=1)
    lam: float = opt(1.0, "GAE lambda.", ge=0, le=1)
    whiten_advantages: bool = opt(True, "gae: normalise advantages over the batch's valid tokens.")
    kl_penalty: str = opt(
        "kl",
        "KL estimator between actor and reference: kl/k1, abs, mse/k2, low_var_kl/k3; "
        "a trailing + (k1+, k3+) takes that estimator's value with k2's gradient.",
        choices=kl_names(),
    )
    kl_ctrl_type: str = opt("fixed", "KL coefficient controller.", choices=("fixed", "adaptive"))
    init_kl_coef: float = opt(
        0.0, "Initial KL coefficient beta; 0 (with a fixed controller) turns the KL and the reference model off.", ge=0
    )
    kl_target: Optional[float] = opt(None, "Target KL of the adaptive controller.", gt=0)
    kl_horizon: Optional[float] = opt(None, "Horizon (samples) of the adaptive controller.", gt=0)
    use_kl_in_reward: bool = opt(
        False,
        "Subtract beta x KL from the token rewards, which every estimator reads "
        "(verl); false: beta x KL is a term of the actor loss (MindSpeed-RL).",
    )
    # on-policy distillation (docs/algorithms.md)
    distill_coef: float = opt(
        0.0,
        "Weight lambda of the teacher's per-token advantage added to the reward advantages "
        "(A = A_reward + lambda x A_distill); 0 turns distillation and the teacher off. Needs teacher_config.",
        ge=0,
    )
    distill_loss: str = opt(
        "reverse_kl",
        "Distillation signal: reverse_kl (log p_teacher - log p_student at each sampled token).",
        choices=tuple(DISTILL_SIGNALS),
    )
    distill_clip: Optional[float] = opt(
        None, "Clip each token's distillation advantage to [-c, c] (null: no clip).", gt=0
    )
    # losses
    policy_loss: str = opt(
        "vanilla",
        "Policy loss: vanilla (PPO clip per token), gspo (sequence-level ratio), cispo (clipped stop-gradient "
        "weight), sapo (soft gate) or gmpo (geometric mean of token ratios): docs/algorithms.md.",
        choices=tuple(POLICY_LOSSES),
    )
    loss_agg_mode: Optional[str] = opt(
        None,
        "How per-token losses become one number, over the whole mini-batch "
        "(null: token-mean, or seq-mean-token-mean for gspo).",
        choices=LOSS_AGG_MODES,
    )
    token_level_loss: Optional[bool] = opt(
        None, "MindSpeed-RL's name: true = loss_agg_mode token-mean, false = seq-mean-token-mean."
    )
    clip_ratio: float = opt(0.2, "PPO ratio clip epsilon (both sides unless clip_ratio_low/high are set).", gt=0, lt=1)
    clip_higher_enable: Optional[bool] = opt(
        None,
        "DAPO clip-higher: clip the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high] (null: on when either is set).",
    )
    clip_ratio_low: Optional[float] = opt(None, "Lower clip epsilon (null: clip_ratio).", gt=0, lt=1)
    clip_ratio_high: Optional[float] = opt(None, "Upper clip epsilon (null: clip_ratio; DAPO: 0.28).", gt=0)
    clip_ratio_c: Optional[float] = opt(
        None, "Dual-clip bound for negative advantages (e.g. 3.0); off when null.", gt=1
    )
    tau_pos: Optional[float] = opt(None, "SAPO's gate temperature for A > 0 (null: 1.0; verl's actor tau_pos).", gt=0)
    tau_neg: Optional[float] = opt(None, "SAPO's gate temperature for A <= 0 (null: 1.05; verl's actor tau_neg).", gt=0)
    cliprange_value: float = opt(0.5, "Value-function clip range.", gt=0)
    entropy_coeff: float = opt(0.0, "Entropy bonus coefficient.", ge=0)
    router_replay: Optional[str] = opt(
        None,
        "MoE routing between rollout and training (docs/models.md): R3 replays the experts the rollout engine "
        "routed each token to in the actor's old-log-prob and update forwards; compare only measures how often the "
        "actor's own routers choose otherwise (router_replay/* metrics); null: off. Needs vLLM >= 0.32.",
        choices=("compare", "R3"),
    )
    rollout_correction: RolloutCorrectionConfig = opt(
        doc="Rollout correction (off by default).", factory=RolloutCorrectionConfig
    )
    # DAPO: overlong reward shaping and dynamic sampling
    overlong_buffer_enable: bool = opt(
        False,
        "Soft overlong punishment: responses longer than rollout_max_tokens "
        "- overlong_buffer lose up to overlong_buffer_penalty_factor.",
    )
    overlong_buffer: int = opt(0, "Length of the punishment ramp (tokens) before rollout_max_tokens.", ge=0)
    overlong_buffer_penalty_factor: float = opt(1.0, "The punishment at rollout_max_tokens.", ge=0)
    rollout_max_tokens: Optional[int] = opt(
        None, "The length L_max of the overlong punishment (null: generate_config.sampling_config.max_tokens).", ge=1
    )
    filter_groups_enable: bool = opt(
        False,
        "Dynamic sampling: drop prompt groups whose responses all score the "
        "same and generate more until the batch is full.",
    )
    filter_groups_metric: Optional[str] = opt(
        None,
        "What must differ inside a group: score, or a verifier's name "
        "(MindSpeed-RL's grpo/<verifier>_rewards/mean is accepted); "
        "null: the first verifier (accuracy), else score.",
    )
    filter_groups_max_batches: int = opt(
        -1,
        "Most generation batches per iteration (-1: no limit). When reached, "
        "the batch is completed with filtered groups (counted in "
        "dynamic_sampling/filled_groups).",
        ge=-1,
    )
    filter_groups_train_batch_size: Optional[int] = opt(
        None, "Prompt groups trained per iteration after filtering (null: global_batch_size).", ge=1
    )
    # partial rollout
    partial_rollout_max_split: int = opt(
        1,
        "Partial rollout when > 1: responses grow in chunks of max_tokens / N "
        "tokens; once global_batch_size prompt groups have finished the batch "
        "trains, and unfinished responses are parked and continued with the "
        "next weights (finished within N iterations). 1: off.",
        ge=1,
    )
    require_max_age_all_finished: bool = opt(
        True,
        "Partial rollout: an iteration also waits for every response "
        "parked N - 1 times to finish (N = partial_rollout_max_split).",
    )
    # asynchronous rollout
    max_head_offpolicyness: int = opt(
        0,
        "Asynchronous rollout when > 0 (AReaL's key): the rollout workers "
        "generate the next iterations' batches while the actor trains, each "
        "sampled at most this many policy versions before it is trained on. "
        "Needs rollout_resource (disaggregated); at most 8 and below "
        "megatron_training.train_iters (docs/rollout.md). 0: synchronous.",
        ge=0,
    )
    async_training: AsyncTrainingConfig = opt(
        doc="Fully asynchronous rollout: in-flight weight updates and bounded staleness (docs/rollout.md).",
        factory=AsyncTrainingConfig,
    )
    rollout_fault_tolerance: RolloutFaultToleranceConfig = opt(
        doc="Deadlines on the rollout side, and engines that fail without failing the run (docs/operations.md).",
        factory=RolloutFaultToleranceConfig,
    )
    # multi-turn rollouts with tools (rollout/source/agent_loop.py)
    rollout_function: str = opt(
        "single_turn",
        "How a trajectory advances: single_turn, tool_agent "
        "(generate, run the tool calls, append their results, continue), "
        "openai_agent (an outside agent's episodes through the policy endpoint), "
        "a RolloutFunction class 'module:Class', or a whole-batch function 'module:function' (no partial rollout).",
    )
    policy_endpoint: PolicyEndpointConfig = opt(
        doc="The OpenAI-compatible endpoint and the harness of openai_agent (docs/agents.md).",
        factory=PolicyEndpointConfig,
    )
    multi_turn_enable: bool = opt(False, "MindSpeed-RL's switch: true is rollout_function tool_agent.")
    tools: List[str] = opt(
        doc="Tools the agent may call: built-in names (calculator, python) or registered "
        "functions 'module:function'. The prompts must list them (preprocessing's tools).",
        factory=list,
    )
    tool_config_path: str = opt(
        "", "A YAML file with a 'tools' list (name, function, description, parameters), added to tools."
    )
    prompt_type: str = opt(
        "qwen",
        "Chat template of the prompts (configs/model/templates.json): its tool role "
        "formats the tool results appended to a trajectory.",
    )
    agent: AgentConfig = opt(doc="The tool agent's loop (docs/agents.md).", factory=AgentConfig)
    sandbox: SandboxConfig = opt(doc="Each tool call's isolation and limits (docs/agents.md).", factory=SandboxConfig)
    # validation
    test_freq: int = opt(
        0,
        "Validate on megatron_training.test_data_path every N iterations and at the end (0: validation off, "
        "val_before_train included; a configured test set is then not read).",
        ge=0,
    )
    val_before_train: bool = opt(False, "With test_freq > 0: validate once before the first iteration too.")
    val_kwargs: ValKwargsConfig = opt(doc="Validation sampling.", factory=ValKwargsConfig)
    # rewards
    rule_reward: bool = opt(True, "Score responses with rule verifiers.")
    verifier_function: List[str] = opt(
        doc="Verifiers: built-in or registered names, or a plug-in by path `package.module:function`.",
        factory=lambda: ["acc_for_ppo"],
    )
    verifier_weight: List[float] = opt(
        doc="Weight of each verifier, same length as verifier_function.", factory=lambda: [1.0]
    )
    verifier_timeout: float = opt(10.0, "Seconds a verifier may take per sample before scoring 0.", gt=0)
    reward_model_weight: float = opt(
        1.0,
        "Weight of the reward model's score (reward_config) in a response's score, beside the verifiers' "
        "(verifier_weight 0: a verifier measured, not rewarded).",
    )


def build_rl_section(rl_data: Mapping[str, Any]) -> RLConfig:
    """The ``rl_config`` section, the flat spellings of the agent's and the sandbox's keys read with a note."""
    data, moved = nest_flat_keys(rl_data)
    if moved:
        print(deprecation_note(moved), flush=True)
    return build_section(RLConfig, data, "rl_config")
