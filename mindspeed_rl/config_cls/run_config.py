"""The types of a whole run's config, apart from the rules that check them: ``RoleConfig`` (one Megatron role),
``PPOConfig`` (the run) and the settled precision (``HostPrecision``, ``PrecisionChoice``). They import the sections
only, so a rule module can name them without importing the module that runs the rules (``ppo_config.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .algorithm_choice import AlgorithmPlan
from .eval_config import EvalConfig
from .generate_config import GenerateConfig
from .judge_config import JudgeConfig
from .megatron_config import MegatronConfig
from .model_config import ModelConfig
from .profiler_config import ProfilerConfig, RoleProfilerConfig
from .rl_config import RLConfig


@dataclass
class HostPrecision:
    """The device's answer (``Accelerator.host_precision``): does it run bf16 natively, and why (one clause for
    the plan: "this CPU has no native bf16: AVX2"). ``bf16_slowdown``: bf16 matmul time over fp32's, measured
    (filled in only where bf16 is not native and a role asks for it)."""

    native_bf16: bool
    why: str
    bf16_slowdown: Optional[float] = None


@dataclass
class PrecisionChoice:
    """What a run trains and generates in, settled once (``PPOConfig.precision``, in run.json and the report)."""

    trained: str  # the actor's: bf16, fp16 or fp32
    engine_dtype: str  # the rollout engines' vLLM dtype ("" without engines)
    summary: str  # the plan's line and the report's row: "fp32 (this CPU has no native bf16: AVX2)"
    warning: Optional[str] = None  # bf16 asked for explicitly where the device only emulates it
    rollout_note: Optional[str] = None  # what a family whose engine kernels need bf16 does under this choice


@dataclass
class RoleConfig:
    """One Megatron role (actor, critic, reward, teacher): its merged training settings and its model."""

    name: str
    megatron: MegatronConfig
    model: ModelConfig
    num_devices: int
    profiler: Optional[RoleProfilerConfig] = None  # profiler_config's settings for this role, if any

    @property
    def trains(self) -> bool:
        """Actor and critic train; the reward model and the distillation teacher are frozen (weights only)."""
        return self.name in ("actor", "critic")

    @property
    def tp(self) -> int:
        return self.megatron.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.megatron.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.megatron.context_parallel_size

    @property
    def dp(self) -> int:
        return self.num_devices // (self.tp * self.pp * self.cp)


@dataclass
class PPOConfig:
    megatron_training: MegatronConfig
    actor: RoleConfig
    critic: RoleConfig
    reward: Optional[RoleConfig]
    rl: RLConfig
    generate: GenerateConfig
    algorithm: Optional[AlgorithmPlan] = None  # resolved from rl_config first of all derived values
    teacher: Optional[RoleConfig] = None  # on-policy distillation's frozen teacher
    judge: Optional[JudgeConfig] = None  # the generative judge (rewards/judge.py)
    dry_run: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    # bf16 / dtype auto settled with the device's answer (precision_rules.settle_precision); None until then
    precision: Optional[PrecisionChoice] = None
    profiler: Optional[ProfilerConfig] = None  # profiler_config; each role's share is its RoleConfig.profiler
    evaluation: Optional[EvalConfig] = None  # eval_config: benchmark suites evaluated during training

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
    def captures_routes(self) -> bool:
        return captures_routes(self.rl, self.generate)

    @property
    def uses_critic(self) -> bool:
        if self.algorithm is None:
            raise ValueError("the algorithm is not resolved yet: features.derive(cfg) resolves it first")
        return self.algorithm.use_critic

    @property
    def roles(self) -> List[RoleConfig]:
        """The Megatron roles this run starts (the critic only when the advantage estimator needs one)."""
        frozen = [role for role in (self.reward, self.teacher) if role is not None]
        return [self.actor] + ([self.critic] if self.uses_critic else []) + frozen

    @property
    def colocated_roles(self) -> List[RoleConfig]:
        """The roles that share the actor's devices (all but a teacher on devices of its own)."""
        return [role for role in self.roles if role is not self.teacher or self.rl.teacher_colocate]

    @property
    def teacher_devices(self) -> int:
        """Devices of a teacher of its own (teacher_colocate false); 0 when it shares the actor's."""
        return self.teacher.num_devices if self.teacher is not None and not self.rl.teacher_colocate else 0

    @property
    def training_roles(self) -> List[RoleConfig]:
        """The roles that train, save and resume (the reward model and the teacher are frozen)."""
        return [role for role in self.roles if role.trains]

    @property
    def rollout_devices(self) -> int:
        """Devices of the rollout workers of their own (disaggregated layout); 0 when the actor generates."""
        return self.rl.rollout_resource.num_npus if self.rl.rollout_resource is not None else 0

    @property
    def judge_devices(self) -> int:
        """Devices of the judge's own engines (judge_config.serve engines); 0 without them."""
        if self.judge is None or self.judge.serve != "engines" or self.rl.judge_resource is None:
            return 0
        return self.rl.judge_resource.num_npus

    @property
    def world_size(self) -> int:
        """Devices that count for the throughput metrics (docs/ppo.md, Metrics)."""
        # integrated: the other roles share the actor's
        return self.actor.num_devices + self.rollout_devices + self.teacher_devices + self.judge_devices


def captures_routes(rl: RLConfig, gen: GenerateConfig) -> bool:
    """The rollout engine returns each token's experts: router replay, or the expert load EPLB counts."""
    return rl.router_replay is not None or gen.eplb_token_collects


def role_key(role: RoleConfig, name: str) -> str:
    """The key ``name`` of ``role``'s own section, as an error names it: ``actor_config.micro_batch_size``."""
    return f"{role.name}_config.{name}"
