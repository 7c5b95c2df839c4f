"""The guards the trainer runs after each iteration: a streak of optimizer steps skipped for a non-finite loss
or gradient, or a policy that has collapsed (no entropy and no gradient left), stops the run (NonFiniteStop,
exit 3); an iteration that looks collapsed is not saved; too few rollout engines in service stop the run after
its iteration is saved (TooFewEngines, exit 4) (docs/operations.md)."""

from __future__ import annotations

import math
from typing import Dict, Optional

from ...config_cls.megatron_config import MegatronConfig


class NonFiniteStop(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient, or the policy collapsed."""


class TooFewEngines(RuntimeError):
    """Fewer rollout engines serve than rl_config.rollout_fault_tolerance.min_healthy_engines: the iteration was
    finished and saved (exit 4)."""


COLLAPSED_ENTROPY = 1e-4  # nats per token: the policy samples one token wherever it is
COLLAPSED_GRAD_NORM = 1e-8  # Adam's epsilon: below it a gradient is rounding noise (docs/operations.md)


def collapsed(metrics: Dict[str, float]) -> Optional[bool]:
    """Whether the actor's policy has collapsed: (near) zero entropy and no gradient left, within
    COLLAPSED_ENTROPY and COLLAPSED_GRAD_NORM. None when the iteration cannot tell: a metric is missing or not
    finite (a skipped step reports a NaN or Inf gradient norm)."""
    entropy, grad_norm = metrics.get("actor/entropy"), metrics.get("grad_norm")
    if entropy is None or grad_norm is None or not (math.isfinite(entropy) and math.isfinite(grad_norm)):
        return None
    return entropy < COLLAPSED_ENTROPY and abs(grad_norm) < COLLAPSED_GRAD_NORM


def stop_on_nonfinite_steps(metrics: Dict[str, float], max_nonfinite_steps: int, iteration: int) -> None:
    """NonFiniteStop when the last ``max_nonfinite_steps`` optimizer steps of the actor, the critic, a reward
    model in training or the SFT model were skipped."""
    for prefix, role in (
        ("actor", "actor"),
        ("critic", "critic"),
        ("rm", "reward model"),
        ("sft", "model"),
        ("dpo", "model"),
    ):
        streak = int(metrics.get(f"{prefix}/nonfinite_streak", 0))
        if streak >= max_nonfinite_steps:
            raise NonFiniteStop(
                f"the {role}'s last {streak} optimizer steps had a NaN/Inf loss or gradient and "
                f"were skipped (rl_config.max_nonfinite_steps {max_nonfinite_steps}); "
                f"iteration {iteration} is not saved"
            )


def next_collapse_streak(metrics: Dict[str, float], streak: int, limit: int) -> int:
    """The iterations in a row with a collapsed policy, this one's ``metrics`` counted (``limit`` 0: the guard
    is off). An iteration that cannot tell neither extends nor ends the streak."""
    verdict = collapsed(metrics) if limit else False
    if verdict is None:
        return streak
    return streak + 1 if verdict else 0


def save_due(metrics: Dict[str, float], streak: int, iteration: int, limit: int, mt: MegatronConfig) -> bool:
    """Whether ``iteration`` is saved: every save_interval iterations and at the last one, unless the policy
    looks collapsed (``streak`` > 0, said on the console). NonFiniteStop when the streak reaches ``limit``
    (rl_config.max_collapsed_iterations) or the run would end on an iteration that is not saved."""
    looks = (
        f"actor entropy below {COLLAPSED_ENTROPY} and gradient norm below {COLLAPSED_GRAD_NORM} in the last "
        f"{streak} iteration(s) (this one: entropy {metrics.get('actor/entropy', float('nan')):.2g}, gradient "
        f"norm {metrics.get('grad_norm', float('nan')):.2g}; rl_config.max_collapsed_iterations {limit}, 0 "
        "turns this off)"
    )
    if streak >= limit > 0:
        raise NonFiniteStop(f"the policy collapsed: {looks}; lower the learning rate. Those iterations are not saved")
    last = iteration == mt.train_iters
    if last and streak:  # the run would end on an unsaved iteration: not a success (exit 3)
        raise NonFiniteStop(
            f"iteration {iteration}, the last, is not saved: the policy looks collapsed, {looks}; "
            "lower the learning rate"
        )
    if iteration % mt.save_interval == 0 or last:
        if streak:
            print(f"iteration {iteration} not saved: the policy looks collapsed, {looks}", flush=True)
        else:
            return True
    return False
