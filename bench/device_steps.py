"""The steps of bench/device_check.py: each takes the Context and returns rows (a list of dicts) or a dict."""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

# Qwen2.5's shapes (0.5B and 1.5B configs: tied embeddings, GQA, qkv bias), random init
QWEN25 = dict(
    group_query_attention=True,
    add_qkv_bias=True,
    untie_embeddings_and_output_weights=False,
    rotary_base=1e6,
    norm_epsilon=1e-6,
    padded_vocab_size=151936,
    max_position_embeddings=32768,
)
SHAPES = {
    "0.5B": dict(num_layers=24, hidden_size=896, ffn_hidden_size=4864, num_attention_heads=14, num_query_groups=2),
    "1.5B": dict(num_layers=28, hidden_size=1536, ffn_hidden_size=8960, num_attention_heads=12, num_query_groups=2),
}
# Qwen2.5-7B's widths (untied embeddings, 28 heads over 4 KV heads), as many layers as fit one device with Adam
WIDE = dict(
    QWEN25,
    hidden_size=3584,
    ffn_hidden_size=18944,
    num_attention_heads=28,
    num_query_groups=4,
    padded_vocab_size=152064,
    untie_embeddings_and_output_weights=True,
)
TOY = dict(QWEN25, padded_vocab_size=512, max_position_embeddings=256)
TOY_WIDE = dict(TOY, hidden_size=128, ffn_hidden_size=384, num_attention_heads=4, num_query_groups=2)
TOY_SHAPES = {
    "toy-2L": dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2),
    "toy-3L": dict(num_layers=3, hidden_size=96, ffn_hidden_size=192, num_attention_heads=4, num_query_groups=2),
}
# dense bf16 peak (no sparsity) by device name; others use the matmul measured in the environment step
BF16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "H20": 148.0, "A100": 312.0, "A800": 312.0}


@dataclass
class Context:
    """What the steps share: sizes, the device, the measured peak, the time left."""

    smoke: bool = False
    deadline: float = float("inf")
    peak_flops: float = 0.0
    peak_source: str = ""
    state: Dict = field(default_factory=dict)

    def __post_init__(self):
        from mindspeed_rl.accelerator import get_accelerator
        from mindspeed_rl.utils import dist

        self.acc = get_accelerator()
        dist.init_distributed()
        dist.init_model_parallel(seed=1)
        self.device = self.acc.current_device()
        self.shapes = (
            {n: dict(TOY, **s) for n, s in TOY_SHAPES.items()}
            if self.smoke
            else {n: dict(QWEN25, **s) for n, s in SHAPES.items()}
        )

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def sync(self) -> None:
        if self.device.type != "cpu":
            self.acc.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float:
        return torch.cuda.max_memory_allocated() / 2**30 if self.cuda else float("nan")

    def release(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def close(self) -> None:
        from mindspeed_rl.utils import dist

        dist.destroy()


def model_config(values: Dict):
    from mindspeed_rl.config_cls import ModelConfig

    cfg = ModelConfig(**values)
    cfg.check()
    return cfg


def engine_for(ctx: Context, shape: str, bf16: bool, trainable: bool = True, recompute: bool = False, **flags):
    """Our engine for ``shape``; ``flags``: further megatron keys (the fused-kernel switches)."""
    from mindspeed_rl.config_cls import MegatronConfig, RoleConfig
    from mindspeed_rl.models.engine import MegatronEngine

    extra = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1) if recompute else {}
    megatron = MegatronConfig(model=shape, bf16=bf16, lr=1e-6, **extra, **flags)
    return MegatronEngine(RoleConfig("actor", megatron, model_config(ctx.shapes[shape]), 1), trainable=trainable)


def timed(ctx: Context, fn, repeats: int) -> float:
    """Seconds per call of ``fn`` (after one warm-up call), device work included."""
    fn()
    ctx.sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    ctx.sync()
    return (time.perf_counter() - start) / repeats


def versions() -> Dict[str, str]:
    from importlib import metadata

    found = {}
    for dist_name in ("torch", "megatron-core", "transformers", "triton", "hydra-core", "omegaconf", "safetensors"):
        try:
            found[dist_name] = metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            found[dist_name] = "absent"
    return found


def step_environment(ctx: Context) -> Dict:
    info: Dict = {"python": platform.python_version(), "host": platform.node(), "torch_cuda": torch.version.cuda}
    info.update({f"version {k}": v for k, v in versions().items()})
    try:
        info["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=os.path.dirname(__file__)
        ).stdout.strip()
    except OSError:
        info["commit"] = "unknown"
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        info.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1))
        info.update(multiprocessors=props.multi_processor_count, capability=f"{props.major}.{props.minor}")
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            info["driver"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            info["driver"] = "nvidia-smi not found"
    else:
        info.update(
            device=f"{ctx.device.type}: {platform.processor() or platform.machine()}", threads=torch.get_num_threads()
        )
    info.update(measure_peak(ctx))
    return info


def measure_peak(ctx: Context) -> Dict:
    """A bf16 matmul's TFLOP/s; sets the MFU denominator: the datasheet's dense bf16 peak of a known device,
    else that matmul."""
    n = 1024 if ctx.smoke or not ctx.cuda else 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=ctx.device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=ctx.device)
    measured = 2 * n**3 / timed(ctx, lambda: a @ b, 3 if ctx.smoke else 10) / 1e12
    name = torch.cuda.get_device_properties(ctx.device).name if ctx.cuda else ""
    named = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)
    ctx.peak_flops = (named or measured) * 1e12
    ctx.peak_source = "datasheet dense bf16" if named else "measured matmul"
    return {
        f"bf16 matmul {n}^3 TFLOP/s": round(measured, 2),
        "MFU peak TFLOP/s": f"{ctx.peak_flops / 1e12:.1f} ({ctx.peak_source})",
    }


def random_batch(rows: int, seq: int, vocab: int, seed: int, ragged: bool) -> Dict[str, torch.Tensor]:
    """Right-padded rows; ``ragged``: each row's length drawn from [seq / 2, seq] (the last row full)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, seq), generator=g)
    mask = torch.ones(rows, seq, dtype=torch.long)
    if ragged:
        lengths = torch.randint(seq // 2, seq + 1, (rows,), generator=g)
        lengths[-1] = seq
        mask = (torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)).long()
        ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask}


def step_parity(ctx: Context) -> List[Dict]:
    """Our builder's model against transformers' model with the same weights, fp32 then bf16."""
    from transformers import AutoModelForCausalLM

    from mindspeed_rl.demo.tiny_hf import hf_config_for
    from mindspeed_rl.rollout.weights.convert_names import hf_named

    shape = next(iter(ctx.shapes))
    cfg = model_config(ctx.shapes[shape])
    rows, seq = (2, 32) if ctx.smoke else (4, 512)
    batch = random_batch(rows, seq, cfg.padded_vocab_size, seed=3, ragged=False)
    ids = batch["input_ids"].to(ctx.device)
    weights: Optional[Dict[str, torch.Tensor]] = None
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        engine = engine_for(ctx, shape, bf16=dtype == torch.bfloat16, trainable=False)
        if weights is None:  # the fp32 model's random weights, given to every other model
            weights = {n: t.detach().clone() for n, t in engine.named_weights()}
        else:
            engine.load_weights(weights)
        ours = engine.forward(batch, rows)["log_probs"][:, 1:].float().to(ctx.device)
        del engine
        hf = AutoModelForCausalLM.from_config(hf_config_for(cfg)).to(device=ctx.device, dtype=dtype).eval()
        missing, unexpected = hf.load_state_dict(dict(hf_named([weights], cfg)), strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:
            raise RuntimeError(f"name mapping: missing {missing[:3]}, unexpected {unexpected[:3]}")
        hf.tie_weights()
        with torch.no_grad():
            logits = hf(input_ids=ids).logits[:, :-1].float()
        theirs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        diff = (ours - theirs).abs()
        out.append(
            dict(
                model=f"Qwen2.5-{shape}" if not ctx.smoke else shape,
                dtype=str(dtype).replace("torch.", ""),
                tokens=rows * seq,
                max_abs_logprob_diff=diff.max().item(),
                mean_abs_logprob_diff=diff.mean().item(),
                mean_logprob=theirs.mean().item(),
                hf_attention=getattr(hf.config, "_attn_implementation", "?"),
            )
        )
        del hf, logits
        ctx.release()
    return out


def step_generation(ctx: Context) -> List[Dict]:
    """The fallback engine (full forward per new token, no KV cache) sampling ``new`` tokens per prompt."""
    from mindspeed_rl.rollout.engines.fallback import generate
    from mindspeed_rl.rollout.engines.fallback_engine import FallbackEngine

    shape = next(iter(ctx.shapes))
    prompts_n, prompt_len, new = (4, 8, 8) if ctx.smoke else (64, 128, 128)
    engine = FallbackEngine(model_config(ctx.shapes[shape]), eos_token_id=None, bf16=True)
    vocab = ctx.shapes[shape]["padded_vocab_size"]
    g = torch.Generator().manual_seed(5)
    prompts = torch.randint(1, vocab, (prompts_n, prompt_len), generator=g).tolist()
    rows = []
    for batch_size in (prompts_n // 4, prompts_n):
        ctx.sync()
        start = time.perf_counter()
        outs = generate(engine.gpt, prompts, new, None, temperature=1.0, seed=7, batch_size=batch_size)
        ctx.sync()
        seconds = time.perf_counter() - start
        produced = sum(len(o.response_ids) for o in outs)
        tokens = [t for o in outs for t in o.response_ids]
        if produced != prompts_n * new or not 0 <= min(tokens) <= max(tokens) < vocab:
            raise RuntimeError(f"generation: {produced} tokens in [{min(tokens)}, {max(tokens)}], vocabulary {vocab}")
        if max(lp for o in outs for lp in o.logprobs) > 0:
            raise RuntimeError("generation: a sampled token's log-prob is above 0")
        rows.append(
            dict(
                model=shape,
                prompts=prompts_n,
                batch=batch_size,
                prompt_tokens=prompt_len,
                new_tokens=new,
                seconds=seconds,
                tokens_per_s=produced / seconds,
                distinct_tokens=len(set(tokens)),
            )
        )
    return rows
