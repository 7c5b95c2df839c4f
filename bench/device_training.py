"""bench/device_check.py's training and head steps: the engine's update step, and the chunked log-prob head."""

from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch

from bench.device_steps import TOY_WIDE, WIDE, Context, engine_for, measure_peak, model_config, random_batch

FUSED = dict(use_fused_rmsnorm=True, use_fused_swiglu=True, use_fused_rotary_pos_emb=True)


def available() -> str:
    """Empty where the device has liger-kernel's kernels, else why not."""
    from mindspeed_rl.accelerator import get_accelerator

    acc = get_accelerator()
    return "" if acc.fused_features()["liger_kernels"] else f"no liger-kernel kernels on {acc.kind}"


MICRO_BATCH_TOKENS = 16384  # rows per micro-batch = this / sequence length; two micro-batches per step


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def nll(outputs, mb):
    """Mean negative log-likelihood of the real next tokens."""
    mask = mb["attention_mask"][:, 1:].float() * mb["attention_mask"][:, :-1].float()
    return -(outputs["log_probs"][:, 1:] * mask).sum() / mask.sum().clamp(min=1), {}


def model_flops(engine, mask: torch.Tensor) -> float:
    """Training FLOPs of the real tokens: 6 N per token + 12 x layers x hidden x row length (attention)."""
    cfg = engine.role.model
    total = sum(p.numel() for p in engine.unwrapped().parameters())
    embedding = cfg.padded_vocab_size * cfg.hidden_size
    matmul = total if not cfg.untie_embeddings_and_output_weights else total - embedding  # the head multiplies too
    lengths = mask.sum(1).double()
    return float((6 * matmul * lengths + 12 * cfg.num_layers * cfg.hidden_size * lengths**2).sum())


def measure(
    ctx: Context, engine, batch: Dict[str, torch.Tensor], micro: int, repeats: int, token_budget: Optional[int] = None
) -> Dict:
    if not ctx.peak_flops:  # the environment step did not run
        measure_peak(ctx)
    ctx.reset_peak()
    seconds = timed_steps(ctx, engine, batch, micro, repeats, token_budget)
    tokens = int(batch["attention_mask"].sum())
    return dict(
        tokens_per_s=tokens / seconds,
        MFU=model_flops(engine, batch["attention_mask"]) / seconds / ctx.peak_flops,
        step_s=seconds,
        peak_mem_gib=ctx.peak_gib(),
    )


def timed_steps(ctx: Context, engine, batch, micro: int, repeats: int, token_budget: Optional[int] = None) -> float:
    result = engine.train_step(batch, nll, micro, token_budget=token_budget)  # warm-up
    if result.skipped:
        raise RuntimeError("the warm-up step was skipped: non-finite loss or gradient")
    ctx.sync()
    start = time.perf_counter()
    for _ in range(repeats):
        engine.train_step(batch, nll, micro, token_budget=token_budget)
    ctx.sync()
    return (time.perf_counter() - start) / repeats


def training_rows(ctx: Context) -> List[Dict]:
    seqs = (32, 64) if ctx.smoke else (1024, 4096)
    micro_tokens = 64 if ctx.smoke else MICRO_BATCH_TOKENS
    repeats = 1 if ctx.smoke else 3
    rows = []
    for shape in ctx.shapes:
        for recompute in (False, True):
            engine = None
            for seq in seqs:
                micro = max(1, micro_tokens // seq)
                batch = random_batch(2 * micro, seq, ctx.shapes[shape]["padded_vocab_size"], seed=seq, ragged=True)
                for packed in (False, True):
                    row = dict(model=shape, seq=seq, rows=2 * micro, micro_batch=micro)
                    row.update(layout="packed" if packed else "padded", recompute="full" if recompute else "none")
                    rows.append(row)
                    if ctx.seconds_left() < 30:
                        row["result"] = "skipped: out of time"
                        continue
                    try:
                        engine = engine or engine_for(ctx, shape, bf16=True, recompute=recompute)
                        engine.remove_padding = packed
                        row.update(measure(ctx, engine, batch, micro, repeats))
                    except Exception as exc:
                        if not is_oom(exc):
                            raise
                        row["result"] = f"out of memory ({ctx.peak_gib():.1f} GiB reached)"
                    if "result" in row:  # freed once the exception (and the frames it holds) is gone
                        engine = None  # a step that ran out of memory leaves the buffers half-used
                        ctx.release()
            del engine
            ctx.release()
    return rows


BYTES_PER_PARAMETER = 18  # bf16 weight 2 + fp32 main copy 4 + fp32 gradient 4 + Adam's two moments 8


def layers_that_fit(shape: Dict, memory_bytes: float, activations: float = 0.5, most: int = 8) -> int:
    """Layers of ``shape`` whose weights, gradients and Adam state take (1 - ``activations``) of ``memory_bytes``
    beside the embedding, output layer and final norm (parameters counted as the batch plan counts them); 1 ..
    ``most``."""
    from mindspeed_rl.families.parameters import parameter_count

    one, two = (parameter_count(model_config(dict(shape, num_layers=n))) for n in (1, 2))
    per_layer = two - one
    room = memory_bytes * (1 - activations) / BYTES_PER_PARAMETER - (one - per_layer)
    return max(1, min(most, int(room // per_layer)))


def wide_shape(ctx: Context):
    """Registers the 7B-widths shape in ``ctx.shapes``; returns its name, row length, token budget and a batch of
    about four micro-batches of the budget."""
    if ctx.smoke:
        shape, seq, budget, layers = dict(TOY_WIDE), 64, 192, 2
    else:
        memory = torch.cuda.get_device_properties(ctx.device).total_memory if ctx.cuda else 16 * 2**30
        shape, seq, budget = dict(WIDE), 4096, 16384
        layers = layers_that_fit(shape, memory)
    shape["num_layers"] = layers
    name = f"7B widths x {layers} layers"
    ctx.shapes[name] = shape
    batch = random_batch(4 * budget // seq, seq, shape["padded_vocab_size"], seed=seq, ragged=True)
    return name, seq, budget, batch


def wide_rows(ctx: Context) -> List[Dict]:
    """The 7B-shaped row: Qwen2.5-7B's widths with as many layers as fit this device with the optimizer, 4K rows
    packed (lengths drawn from [2K, 4K]) and split into micro-batches by a token budget (dynamic batch size), bf16."""
    name, seq, budget, batch = wide_shape(ctx)
    rows = batch["input_ids"].shape[0]
    kernels = [("torch", {})] + [("liger-kernel", FUSED)] * (not available())
    out = []
    try:
        for kernel_name, flags in kernels:
            row = dict(model=name, seq=seq, rows=rows, token_budget=budget, layout="packed", kernels=kernel_name)
            out.append(row)
            if out[:-1] and ctx.seconds_left() < 60:
                row["result"] = "skipped: out of time"
                continue
            engine = None
            try:
                engine = engine_for(ctx, name, bf16=True, **flags)
                engine.remove_padding = True
                row["params_B"] = sum(p.numel() for p in engine.unwrapped().parameters()) / 1e9
                row.update(measure(ctx, engine, batch, rows, 1 if ctx.smoke else 3, token_budget=budget))
            except Exception as exc:
                if not is_oom(exc):
                    raise
                row["result"] = f"out of memory ({ctx.peak_gib():.1f} GiB reached)"
            del engine
            ctx.release()
    finally:
        ctx.shapes.pop(name, None)
    return out


def head_rows(ctx: Context) -> List[Dict]:
    """Forward + backward of log-probs and entropy over Qwen's vocabulary: whole-vocabulary logits at once
    against ``log_prob_chunk_size`` tokens at a time, in bf16."""
    from mindspeed_rl.config_cls import MegatronConfig
    from mindspeed_rl.models.heads import chunked_log_probs

    shape = ctx.shapes[next(iter(ctx.shapes))]
    hidden_size, vocab = shape["hidden_size"], shape["padded_vocab_size"]
    chunk = 64 if ctx.smoke else MegatronConfig(model="head").log_prob_chunk_size
    g = torch.Generator().manual_seed(9)
    weight = (0.02 * torch.randn(vocab, hidden_size, generator=g)).to(ctx.device, torch.bfloat16).requires_grad_(True)
    warm = torch.randn(256, hidden_size, generator=g).to(ctx.device, torch.bfloat16).requires_grad_(True)
    chunked_log_probs(warm, weight, torch.zeros(256, dtype=torch.long, device=ctx.device))[0].sum().backward()
    weight.grad = None
    rows = []
    for tokens in (128, 512) if ctx.smoke else (8192, 32768):
        hidden = torch.randn(tokens, hidden_size, generator=g).to(ctx.device, torch.bfloat16).requires_grad_(True)
        labels = torch.randint(0, vocab, (tokens,), generator=g).to(ctx.device)
        for name, size in (("plain", 0), ("chunked", chunk)):
            row = dict(head=name, tokens=tokens, vocab=vocab, chunk=size or tokens)
            rows.append(row)
            ctx.release()
            ctx.reset_peak()
            base = torch.cuda.memory_allocated() if ctx.cuda else 0
            try:
                ctx.sync()
                start = time.perf_counter()
                log_p, entropy = chunked_log_probs(hidden, weight, labels, with_entropy=True, chunk_size=size)
                (-(log_p.mean()) - 0.01 * entropy.mean()).backward()
                ctx.sync()
                row.update(seconds=time.perf_counter() - start, extra_peak_gib=(ctx.peak_gib() - base / 2**30))
            except Exception as exc:
                if not is_oom(exc):
                    raise
                row["result"] = f"out of memory ({ctx.peak_gib():.1f} GiB reached)"
            hidden.grad = weight.grad = None
    return rows


def profile_rows(ctx: Context) -> List[Dict]:
    """Where a training step of the first shape (1K, packed, torch's modules) goes."""
    shape = next(iter(ctx.shapes))
    seq = 32 if ctx.smoke else 1024
    micro = max(1, (64 if ctx.smoke else MICRO_BATCH_TOKENS) // seq)
    batch = random_batch(2 * micro, seq, ctx.shapes[shape]["padded_vocab_size"], seed=seq, ragged=True)
    engine = engine_for(ctx, shape, bf16=True)
    engine.remove_padding = True
    return profiled(ctx, engine, batch, micro, steps=2)


def wide_profile_rows(ctx: Context) -> List[Dict]:
    """Where the 7B-shaped row's step goes, with liger-kernel's kernels where they are installed."""
    name, _, budget, batch = wide_shape(ctx)
    try:
        engine = engine_for(ctx, name, bf16=True, **({} if available() else FUSED))
        engine.remove_padding = True
        return profiled(ctx, engine, batch, batch["input_ids"].shape[0], steps=1, token_budget=budget)
    finally:
        ctx.shapes.pop(name, None)


def profiled(
    ctx: Context, engine, batch, micro: int, steps: int, top: int = 30, token_budget: Optional[int] = None
) -> List[Dict]:
    """torch.profiler's operators by device time (CPU time on a CPU) over ``steps`` training steps, after two
    unprofiled ones (the first row: their mean)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    unprofiled = timed_steps(ctx, engine, batch, micro, 2, token_budget)  # also compiles and warms up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.train_step(batch, nll, micro, token_budget=token_budget)
        ctx.sync()
    wall = (time.perf_counter() - start) / steps
    events = prof.key_averages()

    def device_us(e) -> float:
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))

    kernels = [e for e in events if e.device_type != DeviceType.CPU]  # device work (operators only launch it)
    busy = sum(device_us(e) for e in kernels) / steps / 1e6
    rows = [dict(operator="(step without the profiler)", kind="", calls=1, device_ms=0.0, cpu_ms=unprofiled * 1e3)]
    rows.append(dict(operator="(step: wall / device busy)", kind="", calls=1, device_ms=busy * 1e3, cpu_ms=wall * 1e3))
    key = device_us if ctx.cuda else (lambda e: e.self_cpu_time_total)
    for e in sorted(events, key=key, reverse=True)[:top]:
        rows.append(
            dict(
                operator=e.key[:60],
                kind="kernel" if e.device_type != DeviceType.CPU else "operator",
                calls=e.count // steps,
                device_ms=device_us(e) / steps / 1e3,
                cpu_ms=e.self_cpu_time_total / steps / 1e3,
            )
        )
    return rows
