"""bench/device_check.py's algorithms step: the RL math on the device against the same math on the CPU (fp32)."""

from __future__ import annotations

from typing import Callable, Dict, List

import torch

TOLERANCE = 1e-4  # fp32: reductions in another order differ by ~1e-6 relative


def inputs(rows: int, length: int, group_size: int) -> Dict[str, torch.Tensor]:
    """Seeded RL tensors on the CPU: ragged response masks, rewards, values, log-probs, group ids."""
    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).float()
    scores = torch.randint(0, 2, (rows,), generator=g).float() + 0.1 * torch.randn(rows, generator=g)
    token_rewards = torch.zeros(rows, length)
    token_rewards[torch.arange(rows), lengths - 1] = scores
    log_prob = -torch.rand(rows, length, generator=g) * 3
    return dict(
        mask=mask,
        token_rewards=token_rewards,
        sequence_rewards=scores,
        values=torch.randn(rows, length, generator=g) * 0.5,
        group=torch.arange(rows) // group_size,
        log_prob=log_prob,
        old_log_prob=log_prob + 0.05 * torch.randn(rows, length, generator=g),
        ref_log_prob=log_prob + 0.2 * torch.randn(rows, length, generator=g),
        returns=torch.randn(rows, length, generator=g),
    )


def cases() -> Dict[str, Callable[[Dict[str, torch.Tensor]], torch.Tensor]]:
    """name -> a function of the inputs giving one tensor (several outputs concatenated)."""
    from mindspeed_rl.algorithms import advantages, distillation, kl, losses, shaping
    from mindspeed_rl.config_cls.algorithm_choice import ADVANTAGE_ESTIMATORS, KL_BASE, POLICY_LOSSES

    found: Dict[str, Callable] = {}
    for name, spec in ADVANTAGE_ESTIMATORS.items():
        found[f"advantage {name}"] = lambda x, spec=spec: torch.cat(
            [t.flatten() for t in advantages.estimate(spec, gamma=1.0, lam=0.95, whiten=True, **x)]
        )
    clip = losses.Clip(0.2, 0.28, 3.0)
    for name, spec in POLICY_LOSSES.items():
        for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            found[f"policy loss {name} ({mode})"] = lambda x, spec=spec, mode=mode: policy(x, spec, clip, mode)
    for form in KL_BASE:
        found[f"kl {form}"] = lambda x, form=form: kl.kl_penalty(x["log_prob"], x["ref_log_prob"], form)
    found["value loss"] = lambda x: losses.value_loss(x["values"], x["values"] * 0.9, x["returns"], x["mask"], 0.2)[0]
    found["reverse-KL distill advantage"] = lambda x: distillation.reverse_kl_advantages(
        x["log_prob"], x["ref_log_prob"], x["mask"]
    )
    found["dynamic-sampling groups"] = lambda x: shaping.informative_groups(x["sequence_rewards"], x["group"]).float()
    return found


def policy(x: Dict[str, torch.Tensor], spec, clip, mode: str) -> torch.Tensor:
    """The loss and its gradient with respect to the log-probs."""
    from mindspeed_rl.algorithms import advantages, losses

    log_prob = x["log_prob"].clone().requires_grad_(True)
    adv, _ = advantages.grpo_advantages(x["sequence_rewards"], x["mask"], x["group"])
    loss, _ = losses.policy_loss(spec, log_prob, x["old_log_prob"], adv, x["mask"], clip, mode=mode)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return torch.cat([loss.detach().reshape(1), grad.flatten()])


def algorithm_rows(ctx) -> List[Dict]:
    rows, length, group = (16, 12, 4) if ctx.smoke else (512, 1024, 8)
    cpu = inputs(rows, length, group)
    dev = {k: v.to(ctx.device) for k, v in cpu.items()}
    out = []
    for name, fn in cases().items():
        want, got = fn(cpu), fn(dev)
        if got.device.type != ctx.device.type:
            raise RuntimeError(f"{name}: result on {got.device}, not on {ctx.device}")
        diff = (got.detach().cpu().float() - want.detach().float()).abs().max().item()
        scale = want.detach().float().abs().max().item()
        out.append(dict(case=name, max_abs_diff=diff, max_abs_value=scale, ok=diff <= TOLERANCE * max(1.0, scale)))
    return out  # a row with ok false fails the step (bench/device_check.py)
