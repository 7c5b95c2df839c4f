"""Rollout correction: the rollout engine (vLLM, bf16 kernels) and the trainer (Megatron) do not give
the sampled tokens exactly the same probabilities. Truncated importance sampling reweights each token
(or each sequence) of the policy loss by pi_old / pi_rollout, capped, to correct for that mismatch.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from .advantages import masked_mean


def mismatch_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> Dict[str, float]:
    """How far the trainer's log-probs are from the engine's on the sampled tokens.

    k1 = mean(log pi_rollout - log pi_old)                        (KL(rollout || old): the tokens are
                                                                   sampled from the rollout policy, so
                                                                   it is >= 0 in expectation; verl's kl)
    k3 = mean(rho - log rho - 1),  rho = pi_old / pi_rollout      (low-variance KL(rollout || old))
    ratio_mean, ratio_max: rho over valid tokens
    """
    m = mask.bool()
    if not m.any():
        return {}
    log_rho = torch.where(m, old_log_prob - rollout_log_prob, torch.zeros_like(old_log_prob)).clamp(-20, 20)
    rho = log_rho.exp()
    return {
        "rollout_correction/kl_k1": float(masked_mean(-log_rho, m)),
        "rollout_correction/kl_k3": float(masked_mean(rho - log_rho - 1, m)),
        "rollout_correction/ratio_mean": float(masked_mean(rho, m)),
        "rollout_correction/ratio_max": float(rho[m].max()),
    }


def truncated_is_weights(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor, level: str, threshold: float
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Truncated importance weights of the policy loss (detached; 0 on padding).

        token:     w_t = min(pi_old_t / pi_rollout_t, C)
        sequence:  w_i = min(prod_t pi_old_t / pi_rollout_t, C), the same for every token of response i
    C = ``threshold``. Metrics: the mean weight and the share of weights the cap cut.
    """
    m = mask.bool()
    log_rho = torch.where(m, old_log_prob - rollout_log_prob, torch.zeros_like(old_log_prob))
    if level == "token":
        log_w = log_rho
    elif level == "sequence":
        log_w = log_rho.sum(1, keepdim=True).expand_as(log_rho)
    else:
        raise ValueError(f"unknown rollout_is level {level!r}")
    raw = log_w.clamp(max=20.0).exp()
    weights = torch.where(m, raw.clamp(max=threshold), torch.zeros_like(raw)).detach()
    return weights, {
        "rollout_correction/is_weight_mean": float(masked_mean(weights, m)),
        "rollout_correction/is_capped_frac": float(masked_mean((raw > threshold).float(), m)),
    }
