"""The algorithm registry: the advantage estimators, policy losses and distillation signals a config can name, what each
needs, and the decisions of one run (critic or not, reference or not, where the KL goes), made once
from ``rl_config`` by ``features.algorithm.resolve_algorithm`` and read by config validation, worker start-up and
the trainer. The names live here, at the foundations, so that the config is checked without importing the
math; each entry names its function in ``algorithms/`` (``advantages.estimate``, ``losses.policy_loss`` and
``distillation.distill_advantages`` call it).

Adding an estimator: write the function in ``algorithms/advantages.py`` (its parameter names say which
inputs it reads: token_rewards, sequence_rewards, values, mask, group, gamma, lam, whiten), add one
``register_advantage`` line here, and a hand-computed test. Nothing here imports torch: a bad config
is refused before any heavy import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


class AlgorithmChoiceError(ValueError):
    """A combination of rl_config keys that does not make an algorithm; ``key`` is the key to change."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}")


@dataclass(frozen=True)
class AdvantageEstimator:
    name: str
    function: str  # its function in algorithms/advantages.py
    needs_critic: bool  # reads the critic's values (a critic group is started)
    min_samples_per_prompt: int  # group estimators need >= 2 responses per prompt
    rewards: str  # "token": reads per-token rewards; "sequence": one reward per response
    summary: str
    aliases: Tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyLoss:
    name: str
    function: str  # its function in algorithms/losses.py
    default_agg_mode: str  # the aggregation the method was published with
    summary: str
    dual_clip: bool = True  # takes rl_config.clip_ratio_c
    gate: bool = False  # SAPO's soft gate: takes rl_config.tau_pos / tau_neg


@dataclass(frozen=True)
class DistillSignal:
    name: str
    function: str  # its function in algorithms/distillation.py
    summary: str


ADVANTAGE_ESTIMATORS: Dict[str, AdvantageEstimator] = {}
POLICY_LOSSES: Dict[str, PolicyLoss] = {}
DISTILL_SIGNALS: Dict[str, DistillSignal] = {}
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_BASE = ("kl", "abs", "mse", "low_var_kl")
KL_ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}  # verl's names


def register_advantage(
    name: str,
    function: str,
    *,
    needs_critic: bool = False,
    min_samples_per_prompt: int = 1,
    rewards: str = "sequence",
    aliases: Tuple[str, ...] = (),
    summary: str = "",
) -> None:
    spec = AdvantageEstimator(name, function, needs_critic, min_samples_per_prompt, rewards, summary, aliases)
    for key in (name,) + aliases:
        if key in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {key!r} is registered twice")
        ADVANTAGE_ESTIMATORS[key] = spec


def register_policy_loss(
    name: str,
    function: str,
    *,
    default_agg_mode: str = "token-mean",
    summary: str = "",
    dual_clip: bool = True,
    gate: bool = False,
) -> None:
    if name in POLICY_LOSSES:
        raise ValueError(f"policy loss {name!r} is registered twice")
    POLICY_LOSSES[name] = PolicyLoss(name, function, default_agg_mode, summary, dual_clip, gate)


def register_distillation(name: str, function: str, *, summary: str = "") -> None:
    if name in DISTILL_SIGNALS:
        raise ValueError(f"distillation signal {name!r} is registered twice")
    DISTILL_SIGNALS[name] = DistillSignal(name, function, summary)


register_advantage(
    "gae", "gae_advantages", needs_critic=True, rewards="token", summary="PPO: GAE on the critic's values, whitened"
)
register_advantage(
    "group_norm",
    "grpo_advantages",
    min_samples_per_prompt=2,
    aliases=("grpo",),
    summary="GRPO: reward normalised by its prompt group's mean and std",
)
register_advantage(
    "dr_grpo",
    "dr_grpo_advantages",
    min_samples_per_prompt=2,
    summary="Dr. GRPO: reward minus its group's mean, no std division",
)
register_advantage(
    "rloo",
    "rloo_advantages",
    min_samples_per_prompt=2,
    summary="RLOO: reward minus the mean of the other responses of its prompt",
)
register_advantage(
    "reinforce_plus_plus",
    "reinforce_plus_plus_advantages",
    rewards="token",
    summary="REINFORCE++: discounted reward-to-go, whitened over the batch",
)
register_advantage(
    "reinforce_plus_plus_baseline",
    "reinforce_plus_plus_baseline_advantages",
    min_samples_per_prompt=2,
    summary="REINFORCE++ with the group mean as baseline, whitened over the batch",
)

register_policy_loss(
    "vanilla", "vanilla_policy_loss", summary="PPO clipped surrogate per token (clip-higher, dual clip)"
)
register_policy_loss(
    "gspo",
    "gspo_policy_loss",
    default_agg_mode="seq-mean-token-mean",
    summary="GSPO: sequence-level ratio (geometric mean of token ratios), clipped",
)
register_policy_loss(
    "cispo",
    "cispo_policy_loss",
    dual_clip=False,
    summary="CISPO: clipped, stop-gradient importance weight on every token's log-prob",
)
register_policy_loss(
    "sapo",
    "sapo_policy_loss",
    default_agg_mode="seq-mean-token-mean",
    dual_clip=False,
    gate=True,
    summary="SAPO: soft sigmoid gate of temperature tau_pos / tau_neg in place of the clip",
)
register_policy_loss(
    "gmpo",
    "gmpo_policy_loss",
    default_agg_mode="seq-mean-token-mean",
    dual_clip=False,
    summary="GMPO: geometric mean of token ratios per sequence, clipped in log space",
)


register_distillation(
    "reverse_kl",
    "reverse_kl_advantages",
    summary="on-policy distillation: per-token advantage log p_teacher - log p_student at the sampled token",
)


def get_distillation(name: str) -> DistillSignal:
    if name not in DISTILL_SIGNALS:
        raise AlgorithmChoiceError(
            "rl_config.distill_loss", f"unknown distillation signal {name!r}; registered: {', '.join(DISTILL_SIGNALS)}"
        )
    return DISTILL_SIGNALS[name]


def kl_names() -> Tuple[str, ...]:
    """Every accepted ``kl_penalty``: ours, verl's k1/k2/k3, and the straight-through ``<name>+`` forms."""
    base = KL_BASE + tuple(KL_ALIASES)
    return base + tuple(f"{name}+" for name in base)


def get_advantage(name: str) -> AdvantageEstimator:
    if name not in ADVANTAGE_ESTIMATORS:
        raise AlgorithmChoiceError(
            "rl_config.adv_estimator", f"unknown estimator {name!r}; registered: {', '.join(ADVANTAGE_ESTIMATORS)}"
        )
    return ADVANTAGE_ESTIMATORS[name]


def get_policy_loss(name: str) -> PolicyLoss:
    if name not in POLICY_LOSSES:
        raise AlgorithmChoiceError(
            "rl_config.policy_loss", f"unknown policy loss {name!r}; registered: {', '.join(POLICY_LOSSES)}"
        )
    return POLICY_LOSSES[name]


@dataclass(frozen=True)
class AlgorithmPlan:
    """The decisions of one run, made once from rl_config."""

    estimator: AdvantageEstimator
    policy_loss: PolicyLoss
    loss_agg_mode: str
    clip_low: float
    clip_high: float
    clip_dual: Optional[float]
    tau_pos: float  # SAPO's gate temperatures (read by sapo only)
    tau_neg: float
    kl_in_reward: bool  # -beta * KL_t in the token rewards (verl's use_kl_in_reward)
    kl_in_loss: bool  # + beta * KL in the actor loss (MindSpeed-RL's GRPO)
    rollout_is: Optional[str]  # None, "token" or "sequence"
    distill: Optional[DistillSignal] = None  # on-policy distillation (a teacher role), None when distill_coef is 0

    @property
    def use_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def use_reference(self) -> bool:
        return self.kl_in_reward or self.kl_in_loss

    def describe(self) -> str:
        kl = "in the reward" if self.kl_in_reward else "in the actor loss" if self.kl_in_loss else "off"
        clip = f"clip [1 - {self.clip_low:g}, 1 + {self.clip_high:g}]" + (
            f", dual clip {self.clip_dual:g}" if self.clip_dual is not None else ""
        )
        if self.policy_loss.gate:
            clip = f"gate tau {self.tau_pos:g} (A > 0) / {self.tau_neg:g} (A <= 0)"
        elif self.policy_loss.name == "gmpo":
            clip = f"log-ratio clip [-{self.clip_low:g}, {self.clip_high:g}]"
        return (
            f"advantages {self.estimator.name} ({self.estimator.summary}); policy loss {self.policy_loss.name}, "
            f"{clip}, {self.loss_agg_mode}; KL {kl}; critic {'yes' if self.use_critic else 'no'}, "
            f"reference {'yes' if self.use_reference else 'no'}"
            + (f"; rollout correction: {self.rollout_is}-level truncated IS" if self.rollout_is else "")
            + (f"; distillation {self.distill.name} ({self.distill.summary})" if self.distill else "")
        )
