"""One PPO iteration against this machine's limit: per-phase times and MFU, e2e_tps and the iteration's MFU.

    .venv/bin/python bench/ppo_iteration.py [--shape tiny|small|50M] [--dtype fp32|bf16] [--iterations 4]
                                            [--prompts 32] [--new-tokens 64]
                                            [--workload fixed|variable] [--packing]

Runs the user's command, `cli/train_ppo.py --config-name ppo_tiny_cpu`, on a randomly initialised model of the
named shape (actor, reference and critic; vLLM rollout in-process), one epoch of one mini-batch, `--prompts`
prompts of the demo set (13-14 tokens) x 1 sample, each response exactly as long as its budget (`ignore_eos`):

- fixed: every response `--new-tokens` tokens;
- variable: each prompt's budget (the dataset key `max_new_tokens`) drawn log-uniformly from 8..`--new-tokens`
  (default 256 here), a 32x spread as in real RL batches.

`--packing` turns on `use_remove_padding`, `use_dynamic_bsz` (token budgets of micro_batch_size x the mean
sequence) and `use_dp_batch_balance`. The first iteration is a warm-up; the table gives the median of the others.

MFU = the model FLOPs of every pass the iteration ran / (timing/all x the matmul peak measured in this run,
in the same dtype and thread count as the workers). Per token, a matmul with N weights costs 2N forward and
6N forward + backward; attention adds 4 x layers x seq x hidden forward (x3 with backward), the causal mask
not discounted. The iteration's passes over its T = responses x (prompt + response) tokens: rollout (2 x N_actor,
prefill and decode each token once), reference and old log-probs (2 x N_actor each), critic values
(2 x N_critic), the actor update (6 x N_actor) and the critic update (6 x N_critic). The input embedding is a
lookup and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.train_run import train  # noqa: E402

# Qwen2-shaped, untied, GQA; head dims vLLM's CPU attention takes (64, 128)
SHAPES = {
    "tiny": dict(
        num_layers=4,
        hidden_size=256,
        ffn_hidden_size=704,
        num_attention_heads=4,
        num_query_groups=2,
        padded_vocab_size=256,
    ),
    "small": dict(
        num_layers=4,
        hidden_size=512,
        ffn_hidden_size=1536,
        num_attention_heads=8,
        num_query_groups=2,
        padded_vocab_size=512,
    ),
    "50M": dict(
        num_layers=10,
        hidden_size=640,
        ffn_hidden_size=1728,
        num_attention_heads=10,
        num_query_groups=2,
        padded_vocab_size=8192,
    ),
    "wide": dict(  # Qwen2.5-1.5B's widths (head_dim 128), 4 layers: where matmuls outweigh element-wise work
        num_layers=4,
        hidden_size=1536,
        ffn_hidden_size=8960,
        num_attention_heads=12,
        num_query_groups=2,
        padded_vocab_size=8192,
    ),
}
PHASES = (
    "timing/all",
    "timing/rollout",
    "timing/reference_model",
    "timing/old_log_p",
    "timing/critic_model",
    "timing/rule_reward",
    "timing/adv",
    "timing/update",
    "timing/update_critic",
    "timing/weight_sync",
)


# with blocking false (ppo_tiny_cpu's): the actor's worker's phases (first) beside the critic's (second)
LANES = {
    "forwards": (("timing/reference_model", "timing/old_log_p"), ("timing/critic_model",)),
    "updates": (("timing/update",), ("timing/update_critic",)),
}


def matmul_shapes(shape: dict, head: str) -> List[Tuple[int, int]]:
    """[out, in] of every weight that takes part in matmuls, as the engines hold them: per layer the fused QKV, the
    attention output, the fused gate-up and the down projection; then the output head (LM or value)."""
    h, f = shape["hidden_size"], shape["ffn_hidden_size"]
    kv = h // shape["num_attention_heads"] * shape["num_query_groups"]
    layer = [(h + 2 * kv, h), (h, h), (2 * f, h), (h, f)]
    return layer * shape["num_layers"] + [(shape["padded_vocab_size"] if head == "lm" else 1, h)]


def matmul_weights(shape: dict, head: str) -> int:
    """Weights that take part in matmuls: every layer's projections and the output head (LM or value)."""
    return sum(out * inp for out, inp in matmul_shapes(shape, head))


def iteration_flops(shape: dict, tokens: float, seq: float, old_log_probs: bool = True) -> float:
    """FLOPs of one PPO iteration over ``tokens`` (prompt + response) tokens of mean length ``seq``; the old
    log-prob pass only when it ran (one epoch of one mini-batch skips it: the old policy is the current one)."""
    attention = 4 * shape["num_layers"] * seq * shape["hidden_size"]  # per token, forward
    actor, critic = matmul_weights(shape, "lm"), matmul_weights(shape, "value")
    forward_actor, forward_critic = 2 * actor + attention, 2 * critic + attention
    # rollout + reference (+ old log-probs) + update (3 x forward); values + critic update (3 x forward)
    actor_passes = 2 + (1 if old_log_probs else 0) + 3
    return tokens * (actor_passes * forward_actor + 4 * forward_critic)


def phase_flops(shape: dict, tokens: float, seq: float) -> dict:
    """Model FLOPs of each timed phase over ``tokens`` tokens of mean length ``seq`` (the passes of
    ``iteration_flops``, phase by phase)."""
    attention = 4 * shape["num_layers"] * seq * shape["hidden_size"]
    forward_actor = 2 * matmul_weights(shape, "lm") + attention
    forward_critic = 2 * matmul_weights(shape, "value") + attention
    return {
        "timing/rollout": tokens * forward_actor,
        "timing/reference_model": tokens * forward_actor,
        "timing/old_log_p": tokens * forward_actor,
        "timing/critic_model": tokens * forward_critic,
        "timing/update": tokens * 3 * forward_actor,
        "timing/update_critic": tokens * 3 * forward_critic,
    }


def measured_peak(dtype: str, threads: int) -> float:
    """The matmul peak (FLOP/s) with the workers' thread count, in ``dtype``."""
    import torch

    from bench.engine import matmul_peak

    torch.set_num_threads(threads)
    return matmul_peak(torch.bfloat16 if dtype == "bf16" else torch.float32)


def variable_dataset(work: str, rows: int, longest: int, seed: int = 3) -> str:
    """The demo prompts with a max_new_tokens budget each, log-uniform in 8..longest, preprocessed."""
    import math
    import random

    from mindspeed_rl.datasets.dataset_config import DatasetConfig
    from mindspeed_rl.datasets.preprocess import preprocess
    from mindspeed_rl.demo.assets import make_rows

    rng = random.Random(seed)
    raw = os.path.join(work, "variable.jsonl")
    with open(raw, "w", encoding="utf-8") as fh:
        for row in make_rows(rows, seed):
            budget = int(round(math.exp(rng.uniform(math.log(8), math.log(longest)))))
            fh.write(json.dumps(dict(row, max_new_tokens=budget)) + "\n")
    prefix = os.path.join(work, "data", "variable")
    preprocess(
        DatasetConfig(
            input=raw,
            tokenizer_name_or_path=os.path.join(ROOT, "demo_assets", "tiny_qwen25_hf"),
            output_prefix=prefix,
            prompt_type="empty",
            seq_length=64,
            dataset_additional_keys=["labels", "max_new_tokens"],
        ),
        progress=False,
    )
    return prefix


def overrides(
    shape_name: str,
    dtype: str,
    iterations: int,
    prompts: int,
    new_tokens: int,
    work: str,
    workload: str = "fixed",
    packing: bool = False,
    micro_batch: int = 16,
) -> list:
    shape = SHAPES[shape_name]
    model = [f"model.tiny_qwen25.{k}={v}" for k, v in shape.items()]
    bf16 = dtype == "bf16"
    extra = []
    if workload == "variable":
        extra += [
            f"megatron_training.data_path={variable_dataset(work, 512, new_tokens)}",
            "megatron_training.dataset_additional_keys=[labels,max_new_tokens]",
        ]
    if packing:
        mean_seq = 16 + (new_tokens if workload == "fixed" else new_tokens // 4)
        budget = max(min(micro_batch, prompts) * mean_seq, 64 + new_tokens)
        extra += [
            "rl_config.use_remove_padding=true",
            "rl_config.use_dynamic_bsz=true",
            "rl_config.use_dp_batch_balance=true",
            f"rl_config.update_max_packing_token_size={budget}",
            f"rl_config.actor_max_packing_token_size={2 * budget}",
            f"rl_config.ref_max_packing_token_size={2 * budget}",
        ]
    return (
        model
        + extra
        + [
            f"megatron_training.train_iters={iterations}",
            f"megatron_training.global_batch_size={prompts}",
            f"megatron_training.bf16={str(bf16).lower()}",
            "megatron_training.test_data_path=null",
            "megatron_training.save_interval=100000",
            "rl_config.test_freq=0",
            "rl_config.val_before_train=false",
            "rl_config.n_samples_per_prompt=1",
            f"rl_config.mini_batch_size={prompts}",
            "rl_config.epochs=1",
            f"rl_config.actor_forward_micro_batch_size={prompts}",
            f"rl_config.ref_forward_micro_batch_size={prompts}",
            f"actor_config.micro_batch_size={min(micro_batch, prompts)}",
            f"critic_config.micro_batch_size={min(micro_batch, prompts)}",
            "actor_config.save=null",
            "actor_config.save_hf=false",
            "critic_config.save=null",
            f"rl_config.log_dir={work}/logs",
            f"generate_config.dtype={'bfloat16' if bf16 else 'float32'}",
            f"generate_config.max_model_len={64 + new_tokens}",
            f"megatron_training.seq_length={64 + new_tokens}",
            f"generate_config.sampling_config.max_tokens={new_tokens}",
            "generate_config.sampling_config.ignore_eos=true",
            "rl_config.max_prompt_length=64",
        ]
    )


def run(args, work: str) -> dict:
    done = train(
        "ppo_tiny_cpu",
        overrides(
            args.shape,
            args.dtype,
            args.iterations,
            args.prompts,
            args.new_tokens,
            work,
            args.workload,
            args.packing,
            args.micro_batch,
        )
        + args.set,
        "training",
    )
    rows = [r for r in done.rows if "timing/all" in r]
    measured = rows[1:] or rows
    return {k: statistics.median(r[k] for r in measured if k in r) for k in measured[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=tuple(SHAPES), default="small")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--iterations", type=int, default=4, help="the first is a warm-up")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=None, help="fixed: 64; variable: the longest budget, 256")
    p.add_argument("--workload", choices=("fixed", "variable"), default="fixed")
    p.add_argument("--packing", action="store_true", help="remove padding + token-budget micro-batches + DP balance")
    p.add_argument("--micro-batch", type=int, default=16, help="training micro-batch rows (budget base with --packing)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a further config override")
    args = p.parse_args()
    args.new_tokens = args.new_tokens or (64 if args.workload == "fixed" else 256)
    from mindspeed_rl.demo.assets import prepare

    prepare(os.path.join(ROOT, "demo_assets"), SHAPES["tiny"]["padded_vocab_size"])  # the demo tokenizer and prompts
    threads = os.cpu_count() or 1
    peak_before = measured_peak(args.dtype, threads)
    with tempfile.TemporaryDirectory(prefix="bench_ppo_") as work:
        m = run(args, work)
    peak = max(peak_before, measured_peak(args.dtype, threads))
    shape = SHAPES[args.shape]
    seq = m["prompt_length/mean"] + m["response_length/mean"]
    tokens = seq * args.prompts
    flops = iteration_flops(shape, tokens, seq, "timing/old_log_p" in m)
    print(
        f"shape {args.shape} ({matmul_weights(shape, 'lm') / 1e6:.1f}M matmul weights), {args.dtype}, "
        f"{args.workload} workload{' with packing' if args.packing else ''}, "
        f"{args.prompts} prompts x {m['response_length/mean']:.0f} new tokens on average "
        f"(min {m['response_length/min']:.0f}, max {m['response_length/max']:.0f}) "
        f"(prompt {m['prompt_length/mean']:.1f}), {threads} threads"
    )
    print(
        f"matmul peak ({args.dtype}): {peak / 1e9:.0f} GFLOP/s; iteration model FLOPs {flops / 1e9:.0f} GFLOP "
        f"-> floor {flops / peak:.2f} s"
    )
    per_phase = phase_flops(shape, tokens, seq)
    from mindspeed_rl.features import load_ppo_config

    beside = not load_ppo_config("ppo_tiny_cpu", args.set).rl.blocking  # the critic beside the actor
    print("| phase | seconds (median of iterations 2..N) | MFU |")
    print("|---|---|---|")
    for key in PHASES:
        if key in m:
            # side by side, a phase has part of the cores: its MFU is its pair's (below)
            alone = key in per_phase and m[key] > 0 and not (beside and any(key in a + c for a, c in LANES.values()))
            print(f"| {key} | {m[key]:.3f} | {f'{per_phase[key] / (m[key] * peak):.1%}' if alone else ''} |")
    walls = 0.0
    for name, lanes in LANES.items() if beside else ():
        wall = max(sum(m.get(key, 0.0) for key in lane) for lane in lanes)
        work = sum(per_phase[key] for lane in lanes for key in lane if key in m)
        walls += wall
        print(f"| {name} side by side (blocking false) | {wall:.3f} | {work / (wall * peak):.1%} |")
    paired = {key for lanes in LANES.values() for lane in lanes for key in lane} if beside else set()
    outside = m["timing/all"] - walls - sum(m.get(key, 0.0) for key in PHASES[1:] if key not in paired)
    print(f"| (outside these phases) | {outside:.3f} | |")
    print(f"| e2e_tps | {m['e2e_tps']:.0f} | |")
    print(f"| iteration | {m['timing/all']:.3f} | {flops / (m['timing/all'] * peak):.1%} |")
    if "rollout/logprob_diff_max" in m:
        print(f"| rollout/logprob_diff_max | {m['rollout/logprob_diff_max']:.2e} |")


if __name__ == "__main__":
    main()
