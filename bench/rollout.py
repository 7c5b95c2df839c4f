"""Rollout throughput: vLLM (in-process, CPU) in fp32, bf16, INT8 or FP8 vs the megatron-core fallback, and
weight-sync time.

    PYTHONPATH=. .venv/bin/python bench/rollout.py [--prompts 64] [--n 4] [--new-tokens 128] [--fallback-prompts 8]
        [--engines vllm:float32,fallback] [--models 12M,50M]

Random prompts of 32 tokens on randomly initialised Qwen2-shaped models (12M, 50M, 170M). ``--engines`` lists
``vllm:<dtype>`` (float32, bfloat16), ``vllm:int8`` / ``vllm:fp8`` (generate_config.rollout_quantization on a
bf16 engine) and ``fallback``. tokens/s counts generated tokens. The fallback re-runs the whole sequence every step
(no KV cache), so it is timed on --fallback-prompts prompts to keep the run short; its tokens/s is comparable, its
total time is not. Weight sync = megatron shards -> full pieces -> vLLM's in-place layer-wise reload (+ prefix-cache
reset; INT8 / FP8: the weights quantized again).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from bench.engine import MODELS
from mindspeed_rl.config_cls import GenerateConfig, MegatronConfig, ModelConfig, RoleConfig, SamplingConfig
from mindspeed_rl.models.engine import MegatronEngine
from mindspeed_rl.protocol import RolloutRequest
from mindspeed_rl.rollout.engines.factory import make_rollout_engine
from mindspeed_rl.rollout.weights.resharding import iter_full_weights
from mindspeed_rl.utils import dist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--fallback-prompts", type=int, default=8)
    p.add_argument("--models", default="12M,50M")
    p.add_argument("--engines", default="vllm:float32,fallback")
    args = p.parse_args()
    dist.init_distributed()
    dist.init_model_parallel(seed=1)
    print(f"threads {torch.get_num_threads()}, {args.prompts} prompts x n {args.n}, {args.new_tokens} new tokens")
    print("| model | params | engine | sequences | generated tokens | seconds | tokens/s | weight sync s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model = ModelConfig(
            max_position_embeddings=1024,
            group_query_attention=True,
            add_qkv_bias=True,
            untie_embeddings_and_output_weights=True,
            **MODELS[name],
        )
        role = RoleConfig("actor", MegatronConfig(model=name), model, 1)
        actor = MegatronEngine(role, trainable=False)
        n_params = sum(p.numel() for p in actor.unwrapped().parameters())
        g = torch.Generator().manual_seed(0)
        for variant in args.engines.split(","):
            backend, _, precision = variant.partition(":")
            count = args.fallback_prompts if backend == "fallback" else args.prompts
            quantized = precision in ("int8", "fp8")
            gen = GenerateConfig(
                backend=backend,
                dtype="bfloat16" if quantized else precision or "float32",
                rollout_quantization=precision if quantized else "none",
                max_model_len=32 + args.new_tokens,
                max_num_seqs=256,
                max_num_batched_tokens=8192,
                gpu_memory_utilization=0.05,
            )
            engine = make_rollout_engine(model, gen, "cpu", eos_token_id=None if backend == "fallback" else 0)
            t0 = time.perf_counter()
            engine.update_weights(iter_full_weights(actor))
            sync = time.perf_counter() - t0
            prompts = torch.randint(1, model.padded_vocab_size, (count, 32), generator=g).tolist()
            sampling = SamplingConfig(temperature=1.0, max_tokens=args.new_tokens, seed=1)
            engine.generate(
                RolloutRequest.of(prompts[:2], SamplingConfig(temperature=1.0, max_tokens=4, seed=1))
            )  # warm-up
            t0 = time.perf_counter()
            outs = engine.generate(RolloutRequest.of(prompts, sampling, n=args.n))
            elapsed = time.perf_counter() - t0
            tokens = sum(len(o.response_ids) for o in outs)
            print(
                f"| {name} | {n_params / 1e6:.1f}M | {variant} | {len(outs)} | {tokens} | {elapsed:.1f} | "
                f"{tokens / elapsed:,.0f} | {sync:.3f} |",
                flush=True,
            )
            engine.shutdown()
        del actor
    dist.destroy()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    main()
