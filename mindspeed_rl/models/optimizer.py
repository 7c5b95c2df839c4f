"""What a trainable engine trains with: megatron-core's DDP wrapper around the model, its Adam optimizer
(distributed or not, fp16 loss scaling) and the lr / weight-decay schedule (``OptimizerParamScheduler``),
all from the role's megatron section."""

from __future__ import annotations

import math
from typing import Callable, List, Tuple

from ..config_cls.megatron_config import MegatronConfig
from .builder import params_dtype


def wrap_ddp(gpt, use_distributed_optimizer: bool):
    """``gpt`` in megatron's DistributedDataParallel (fp32 gradient reduction, no overlap)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        use_distributed_optimizer=use_distributed_optimizer,
        bucket_size=None,
    )
    return DistributedDataParallel(config=gpt.config, ddp_config=ddp_config, module=gpt)


def build_optimizer(model: List, config, m: MegatronConfig, total_steps: int) -> Tuple:
    """(optimizer, scheduler) of the DDP-wrapped ``model`` chunks; the schedule decays over ``lr_decay_iters``
    or ``total_steps``. ``config`` (the model's TransformerConfig) gets megatron's gradient finalisation and
    the optimizer's loss scaling."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=m.lr,
        min_lr=m.min_lr,
        weight_decay=m.weight_decay,
        adam_beta1=m.adam_beta1,
        adam_beta2=m.adam_beta2,
        adam_eps=m.adam_eps,
        clip_grad=m.clip_grad,
        bf16=m.bf16,
        fp16=m.fp16,
        params_dtype=params_dtype(m),
        use_distributed_optimizer=m.use_distributed_optimizer,
        loss_scale=None,  # fp16: a dynamic loss scale; bf16 and fp32 need none
        initial_loss_scale=2.0**16,  # torch's GradScaler's start: fewer overflowing first steps than megatron's 2^32
    )
    optimizer = get_megatron_optimizer(opt_config, model, use_gloo_process_groups=True)
    decay_steps = max(1, m.lr_decay_iters or total_steps)
    warmup = int(m.lr_warmup_fraction * decay_steps)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if warmup else m.lr,
        max_lr=m.lr,
        min_lr=m.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=decay_steps,
        lr_decay_style=m.lr_decay_style,
        start_wd=m.weight_decay,
        end_wd=m.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
    )
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    return optimizer, scheduler


def fuse_adam_steps(optimizer) -> None:
    """torch's fused Adam(W) step where the accelerator has it (``fused_adam``): megatron-core builds torch's AdamW
    when neither Transformer Engine's nor Apex's optimizer is installed, and torch would step it tensor by tensor.
    Cheap and idempotent: the engine applies it before each step, as a loaded checkpoint brings its own param
    groups (their ``fused`` key included)."""
    import torch

    from ..accelerator import get_accelerator
    from ..checkpoint.optimizer_state import sub_optimizers

    if not get_accelerator().fused_adam:
        return
    for sub in sub_optimizers(optimizer):
        inner = getattr(sub, "optimizer", None)
        if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            for group in inner.param_groups:
                group["foreach"], group["fused"] = None, True


def step_unless_nonfinite(
    optimizer, losses_finite: bool, agree: Callable[[List[bool]], List[bool]]
) -> Tuple[bool, float, bool]:
    """megatron's optimizer step split at its public seams, with one gradient norm for both the finiteness
    check and the clipping: (stepped, grad_norm, nonfinite).

    The gradients are made ready (fp16: unscaled, checked, and the loss scale updated), their norm is taken
    once over the ranks megatron reduces it over (float32: a norm whose square overflows is Inf), and
    ``agree`` (each flag true on every rank of the role's world) decides; a non-finite loss, gradient or norm
    anywhere skips the step: weights and optimizer state stay as they were, and the reported norm is NaN or
    Inf. ``nonfinite`` is false for an fp16 step that overflowed while its loss scale could still back off:
    that is the scale finding its level, not a diverging run."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    from ..checkpoint.optimizer_state import sub_optimizers

    subs = sub_optimizers(optimizer)
    can_back_off = _loss_scale_above_minimum(subs[0])  # megatron scales the loss by the first one's scale
    found_inf = bool(optimizer.prepare_grads())
    grad_norm = float("nan") if found_inf else float(optimizer.get_grad_norm())
    losses_ok, gradients_ok = agree([losses_finite, math.isfinite(grad_norm)])
    if not (losses_ok and gradients_ok):
        reported = grad_norm if not math.isfinite(grad_norm) else float("nan")
        return False, reported, not (found_inf and can_back_off and losses_ok)
    for sub in subs:
        params = [] if getattr(sub, "is_stub_optimizer", False) else sub.get_parameters()
        if params and sub.config.clip_grad > 0.0:  # no precision-aware optimizer here: gradients sit in .grad
            clip_grad_by_total_norm_fp32(params, sub.config.clip_grad, grad_norm)
    optimizer.step_with_ready_grads()
    return True, grad_norm, False


def _loss_scale_above_minimum(sub) -> bool:
    """Whether ``sub`` has a dynamic loss scale (fp16) that an overflow would still lower."""
    scaler = getattr(sub, "grad_scaler", None)
    floor = getattr(scaler, "min_scale", None)
    return floor is not None and float(scaler.scale) > float(floor)
