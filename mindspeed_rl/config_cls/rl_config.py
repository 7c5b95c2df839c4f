"""The ``rl_config`` section: PPO algorithm, rewards, resources, logging."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .base import opt


@dataclass
class ResourceConfig:
    """Devices given to one role."""

    num_npus: int = opt(doc="Devices (NPUs, GPUs, or CPU slots on CPU) for this role.", ge=1)


@dataclass
class IntegratedModeConfig:
    """Integrated (co-located) mode options."""

    ref_model_load_path: Optional[str] = opt(
        None, "Load the reference model from this checkpoint instead of the actor's initial weights.")


@dataclass
class RLConfig:
    """PPO iteration, advantage and loss settings, rewards, resources and logging."""

    # orchestration
    guarantee_order: bool = opt(False, "Keep samples in prompt order through the pipeline.")
    use_integrated_worker: bool = opt(True, "Actor, rollout engine and reference share one worker per rank, "
                                            "and the critic sits on the same devices.")
    blocking: bool = opt(True, "Each stage finishes before the next starts.")
    num_cpus_for_local_task: float = opt(1.0, "CPUs reserved for the driver's local tasks.", gt=0)
    actor_resource: ResourceConfig = opt(doc="Devices of the actor group.", factory=lambda: ResourceConfig(1))
    critic_resource: ResourceConfig = opt(doc="Devices of the critic group.", factory=lambda: ResourceConfig(1))
    reward_resource: Optional[ResourceConfig] = opt(None, "Devices of the reward-model group (ORM).")
    integrated_mode_config: IntegratedModeConfig = opt(doc="Integrated-mode options.", factory=IntegratedModeConfig)
    # batch split
    n_samples_per_prompt: int = opt(1, "Responses sampled per prompt.", ge=1)
    mini_batch_size: int = opt(1, "Responses per optimizer step; global_batch_size x n_samples_per_prompt "
                                  "must be a multiple.", ge=1)
    epochs: int = opt(1, "Passes over the experience of one iteration.", ge=1)
    shuffle_mini_batch: bool = opt(False, "Shuffle samples before splitting into mini-batches.")
    actor_forward_micro_batch_size: int = opt(1, "Samples per no-grad actor forward (old log-probs).", ge=1)
    ref_forward_micro_batch_size: int = opt(1, "Samples per reference forward.", ge=1)
    max_prompt_length: int = opt(2048, "Prompts longer than this (tokens) are dropped at load.", ge=1)
    max_nonfinite_steps: int = opt(3, "Consecutive optimizer steps of one role skipped for a NaN/Inf loss or "
                                      "gradient after which the run stops with exit code 3 (each skipped step "
                                      "is counted in <role>/skipped_steps).", ge=1)
    # advantages and KL
    adv_estimator: str = opt("gae", "Advantage estimator.", choices=("gae", "group_norm"))
    gamma: float = opt(1.0, "Discount.", ge=0, le=1)
    lam: float = opt(1.0, "GAE lambda.", ge=0, le=1)
    whiten_advantages: bool = opt(True, "Normalise advantages over the batch's valid tokens.")
    kl_penalty: str = opt("kl", "KL estimator between actor and reference.",
                          choices=("kl", "abs", "mse", "low_var_kl"))
    kl_ctrl_type: str = opt("fixed", "KL coefficient controller.", choices=("fixed", "adaptive"))
    init_kl_coef: float = opt(0.0, "Initial KL coefficient.", ge=0)
    kl_target: Optional[float] = opt(None, "Target KL of the adaptive controller.", gt=0)
    kl_horizon: Optional[float] = opt(None, "Horizon (samples) of the adaptive controller.", gt=0)
    use_kl_in_reward: bool = opt(False, "Subtract coef x KL from the token rewards (else KL is a loss term).")
    # losses
    clip_ratio: float = opt(0.2, "PPO ratio clip epsilon.", gt=0, lt=1)
    clip_ratio_c: Optional[float] = opt(None, "Dual-clip bound for negative advantages (e.g. 3.0); off when null.", gt=1)
    cliprange_value: float = opt(0.5, "Value-function clip range.", gt=0)
    entropy_coeff: float = opt(0.0, "Entropy bonus coefficient.", ge=0)
    # rewards
    rule_reward: bool = opt(True, "Score responses with rule verifiers.")
    verifier_function: List[str] = opt(doc="Registered verifier names.", factory=lambda: ["acc_for_ppo"])
    verifier_weight: List[float] = opt(doc="Weight of each verifier, same length as verifier_function.",
                                       factory=lambda: [1.0])
    verifier_timeout: float = opt(10.0, "Seconds a verifier may take per sample before scoring 0.", gt=0)
    # logging
    use_tensorboard: bool = opt(False, "Write every metric to tensorboard.")
    use_wandb: bool = opt(False, "Log to Weights & Biases (offline mode works without network).")
    wandb_project: str = opt("mindspeed_rl", "wandb project.")
    wandb_exp_name: str = opt("ppo", "wandb run name.")
    wandb_save_dir: str = opt("./wandb", "wandb files folder.")
    log_dir: str = opt("./logs", "Run folder root: metrics.jsonl, tensorboard, curves.")
