"""The config of a single-role training stage: reward-model training (cli/train_rm.py) and supervised
fine-tuning (cli/train_sft.py), built from the PPO config's sections where they mean the same thing.

    megatron_training   the model, tokenizer, datasets (data_path, test_data_path), global_batch_size (examples or
                        preference pairs per optimizer step), seq_length (the longest sequence kept), train_iters
                        (optimizer steps), save_interval, seed, stage (rm or sft)
    <role section>      the trained model's own overrides (parallelism, lr, LoRA, load / save / finetune, save_hf):
                        reward_config for rm (micro_batch_size counts pairs: two sequences each), actor_config for
                        sft (the model a PPO run then loads as its actor)
    rl_config           the role's resource (devices), test_freq / val_before_train (held-out metrics), logging,
                        use_remove_padding, the guards (max_nonfinite_steps, max_restarts)

What a stage trains is what a PPO run loads in the same section (the same checkpoint layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .base import ConfigError, build_section, closest_key
from .dpo_config import DPOConfig
from .logging_config import LoggingKeys
from .megatron_config import MegatronConfig
from .ppo_config import _role, model_and_base
from .rl_config import RLConfig, build_rl_section
from .run_config import PrecisionChoice, RoleConfig


@dataclass(frozen=True)
class Stage:
    """What differs between the single-role stages, down to the classes that run one: ``worker`` and ``trainer``
    are plug-in paths (``module:Class``, as a rollout function is named), imported when the stage launches."""

    name: str  # megatron_training.stage
    title: str  # in messages: "reward-model training"
    role: str  # the RoleConfig's name
    section: str  # the role's config section
    resource: str  # the rl_config key of its devices
    data: str  # what data_path holds
    unit: str  # what global_batch_size and micro_batch_size count
    worker: str  # the Ray worker class of each rank (workers/)
    trainer: str  # the StageTrainer subclass that runs the loop (trainer/stages/)
    header: str  # the batch plan's first line
    measured: str  # what validation reports, in the plan
    head: str = "lm"  # the model's head: "lm", or "value" (a scalar per sequence: HF's --orm form)
    rl_keys: Tuple[str, ...] = ()  # the rl_config keys it reads besides RL_KEYS and its resource
    options: str = ""  # a section of its own (dpo_config)

    @property
    def all_rl_keys(self) -> Tuple[str, ...]:
        return (self.resource,) + RL_KEYS + self.rl_keys


TOKEN_BUDGET = ("use_dynamic_bsz", "update_max_packing_token_size")  # micro-batches of a token budget
STAGES = {
    "rm": Stage(
        "rm", "reward-model training", "reward", "reward_config", "reward_resource", "pairs", "pairs",
        worker="mindspeed_rl.workers.reward_model_worker:RewardModelWorker",
        trainer="mindspeed_rl.trainer.stages.rm_trainer:RewardModelTrainer",
        header="reward-model training (Bradley-Terry, -log sigmoid(r_chosen - r_rejected)):",
        measured="pair accuracy", head="value",
    ),
    "sft": Stage(
        "sft", "supervised fine-tuning", "actor", "actor_config", "actor_resource", "examples", "examples",
        worker="mindspeed_rl.workers.sft_worker:SFTWorker",
        trainer="mindspeed_rl.trainer.stages.sft_trainer:SFTTrainer",
        header="supervised fine-tuning (loss: -log p of the assistant tokens, averaged over the step's tokens):",
        measured="loss and perplexity", rl_keys=TOKEN_BUDGET,
    ),
    "dpo": Stage(
        "dpo", "preference optimisation", "actor", "actor_config", "actor_resource", "pairs", "pairs",
        worker="mindspeed_rl.workers.dpo_worker:DPOWorker",
        trainer="mindspeed_rl.trainer.stages.dpo_trainer:DPOTrainer",
        header="preference optimisation ({options}):", measured="loss and reward accuracy", options="dpo_config",
    ),
}  # fmt: skip
# the rl_config keys a stage reads (besides its resource); any other is refused (it would be silently ignored)
RL_KEYS = (
    "use_remove_padding",
    "test_freq",
    "val_before_train",
    "max_nonfinite_steps",
    "max_restarts",
) + tuple(f.name for f in fields(LoggingKeys))


@dataclass
class StageConfig:
    stage: Stage
    megatron_training: MegatronConfig
    role: RoleConfig
    rl: RLConfig
    dry_run: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    dpo: Optional[DPOConfig] = None  # the dpo stage's dpo_config
    precision: Optional[PrecisionChoice] = None  # bf16 auto settled (precision_rules.settle_precision)

    @property
    def roles(self) -> List[RoleConfig]:
        return [self.role]

    @property
    def training_roles(self) -> List[RoleConfig]:
        """The role that trains, saves and resumes (failures.py restarts and resumes it)."""
        return [self.role]

    @property
    def world_size(self) -> int:
        return self.role.num_devices

    @property
    def validates(self) -> bool:
        return self.rl.test_freq > 0


def assemble_stage_config(data: Mapping[str, Any], stage: str, config_dir: Optional[str] = None) -> StageConfig:
    """A single-role stage's typed config from its composed mapping, each section checked on its own (ConfigError
    naming the key); the rules across keys are the features' (features.build_stage_config runs them)."""
    spec = STAGES[stage]
    top_level: Tuple[str, ...] = (
        "defaults",
        "model",
        "megatron_training",
        spec.section,
        "rl_config",
        "dry_run",
        "hydra",
    )
    top_level += (spec.options,) if spec.options else ()
    if not isinstance(data, Mapping):
        raise ConfigError("", "the config must be a mapping of sections")
    for key in data:
        if key not in top_level:
            hint = closest_key(str(key), top_level)
            raise ConfigError(
                str(key),
                f"not a section of a {spec.title} config ("
                + ", ".join(k for k in top_level if k not in ("defaults", "hydra"))
                + ")"
                + (f"; did you mean '{hint}'?" if hint else ""),
            )
    models, base = model_and_base(data)
    rl_data = data.get("rl_config") or {}
    if not isinstance(rl_data, Mapping):
        raise ConfigError("rl_config", "must be a mapping")
    for key in rl_data:
        if key not in spec.all_rl_keys:
            raise ConfigError(
                f"rl_config.{key}", f"is not read by {spec.title}; it reads " + ", ".join(spec.all_rl_keys)
            )
    megatron_training = build_section(MegatronConfig, base, "megatron_training", require=False)
    rl = build_rl_section(rl_data)
    resource = getattr(rl, spec.resource)
    if resource is None:
        raise ConfigError(f"rl_config.{spec.resource}", f"required: the devices the {spec.role} trains on")
    if data.get(spec.section) is not None and not isinstance(data[spec.section], Mapping):
        raise ConfigError(spec.section, "must be a mapping")
    role = _role(spec.role, spec.section, data, base, models, config_dir, resource.num_npus)
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ConfigError("dry_run", f"got {dry_run!r}, expected true or false")
    dpo = build_section(DPOConfig, data.get("dpo_config") or {}, "dpo_config", require=False) if spec.options else None
    cfg = StageConfig(spec, megatron_training, role, rl, dry_run=dry_run, raw=dict(data), dpo=dpo)
    return cfg
