"""bench/device_check.py's fused_kernels step: liger-kernel's RMSNorm, SwiGLU and RoPE (``use_fused_rmsnorm``,
``use_fused_swiglu``, ``use_fused_rotary_pos_emb``; models/fused_kernels.py) against torch's on the same weights.

Parity: log-probs of the real tokens (forward), then the loss and gradient norm of one training step, fp32 and
bf16. Speed: the training step of the first shape at 4K packed, torch's modules then the fused ones.
"""

from __future__ import annotations

from typing import Dict, List

from bench.device_steps import Context, engine_for, random_batch
from bench.device_training import FUSED, MICRO_BATCH_TOKENS, available, measure, nll


def swapped(engine) -> int:
    from mindspeed_rl.models.fused_kernels import FusedRMSNorm, FusedSwiGLU

    return sum(isinstance(m, (FusedRMSNorm, FusedSwiGLU)) for chunk in engine.model for m in chunk.modules())


def parity_rows(ctx: Context, shape: str) -> List[Dict]:
    rows_n, seq = (2, 32) if ctx.smoke else (4, 512)
    batch = random_batch(rows_n, seq, ctx.shapes[shape]["padded_vocab_size"], seed=3, ragged=True)
    real = batch["attention_mask"][:, 1:].bool()
    out = []
    for bf16 in (False, True):
        results = []
        weights = None
        for flags in ({}, FUSED):
            engine = engine_for(ctx, shape, bf16=bf16, **flags)
            if weights is None:
                weights = {n: t.detach().clone() for n, t in engine.named_weights()}
            else:
                engine.load_weights(weights)
            log_p = engine.forward(batch, rows_n)["log_probs"][:, 1:].float().cpu()[real]
            step = engine.train_step(batch, nll, rows_n)
            results.append((log_p, step.loss, step.grad_norm, swapped(engine)))
            del engine
            ctx.release()
        (want, loss, norm, _), (got, fused_loss, fused_norm, modules) = results
        out.append(
            dict(
                check="parity",
                model=shape,
                dtype="bf16" if bf16 else "fp32",
                modules_swapped=modules,
                max_abs_logprob_diff=float((got - want).abs().max()),
                loss_rel_diff=abs(fused_loss - loss) / max(abs(loss), 1e-12),
                grad_norm_rel_diff=abs(fused_norm - norm) / max(abs(norm), 1e-12),
            )
        )
    return out


def speed_rows(ctx: Context, shape: str) -> List[Dict]:
    seqs = (64,) if ctx.smoke else (4096,)  # one length: the 7B row after this step needs the time
    micro_tokens = 64 if ctx.smoke else MICRO_BATCH_TOKENS
    rows = []
    for seq in seqs:
        micro = max(1, micro_tokens // seq)
        batch = random_batch(2 * micro, seq, ctx.shapes[shape]["padded_vocab_size"], seed=seq, ragged=True)
        for name, flags in (("torch", {}), ("liger-kernel", FUSED)):
            if ctx.seconds_left() < 30:
                rows.append(dict(check="training", model=shape, seq=seq, kernels=name, result="skipped: out of time"))
                continue
            engine = engine_for(ctx, shape, bf16=True, **flags)
            engine.remove_padding = True
            row = dict(check="training", model=shape, seq=seq, kernels=name, layout="packed")
            row.update(measure(ctx, engine, batch, micro, 1 if ctx.smoke else 3))
            rows.append(row)
            del engine
            ctx.release()
    return rows


def kernel_rows(ctx: Context) -> List[Dict]:
    reason = available()
    if reason:
        return [dict(check="fused kernels", result=f"skipped: {reason}")]
    shape = next(iter(ctx.shapes))
    return parity_rows(ctx, shape) + speed_rows(ctx, shape)
