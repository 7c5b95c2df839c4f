"""KL estimators between the actor and the reference, and the KL coefficient controllers."""

from __future__ import annotations

import math

import torch

from ..config_cls.algorithm_choice import KL_ALIASES, kl_names
from .advantages import masked_mean


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "kl") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from log-probs of the sampled tokens.

    kl  (k1):         log pi - log pi_ref
    abs:              |log pi - log pi_ref|
    mse (k2):         0.5 (log pi - log pi_ref)^2
    low_var_kl (k3):  exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1, clamped to [-10, 10]
    <name>+:          straight-through: the value of <name>, the gradient of k2
                      (k2's gradient is the unbiased gradient of KL; k1's and k3's are not):
                      k2 - sg(k2) + sg(<name>)
    """
    if kind.endswith("+"):
        value = kl_penalty(log_prob, ref_log_prob, kind[:-1])
        k2 = kl_penalty(log_prob, ref_log_prob, "mse")
        return k2 - k2.detach() + value.detach()
    kind = KL_ALIASES.get(kind, kind)
    diff = log_prob - ref_log_prob
    if kind == "kl":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    if kind == "low_var_kl":
        r = (-diff).clamp(-20, 20)
        return (r.exp() - r - 1).clamp(-10, 10)
    raise ValueError(f"unknown kl_penalty {kind!r}; known: {', '.join(kl_names())}")


def controller_kl(kl: torch.Tensor, mask: torch.Tensor) -> float:
    """The KL an adaptive controller is fed: the mean over responses of each response's token mean,

        KL = (1/B) sum_i [ sum_t m_it kl_it / sum_t m_it ]

    (verl's ``current_kl``): a long response weighs as much as a short one.
    """
    return float(masked_mean(kl, mask, dim=1).mean())


class FixedKLController:
    """beta stays at init_kl_coef."""

    def __init__(self, init_kl_coef: float):
        self.value = init_kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        return None

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class AdaptiveKLController:
    """Ziegler et al. (2019): move beta toward the target KL, proportionally and clipped.

    e = clip(KL / target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n_steps / horizon)
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        self.value, self.target, self.horizon = init_kl_coef, target, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        if not math.isfinite(current_kl):
            return
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def make_kl_controller(kind: str, init_kl_coef: float, target=None, horizon=None):
    if kind == "fixed":
        return FixedKLController(init_kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(init_kl_coef, target, horizon)
    raise ValueError(f"unknown kl_ctrl_type {kind!r}")
