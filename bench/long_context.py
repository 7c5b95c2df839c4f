"""Long sequences: peak memory per rank and time per token against length, CP 1 vs CP 2 (Ulysses), the
LM head's log-probs chunked vs whole.

    .venv/bin/python bench/long_context.py [--lengths 1024 2048 4096 8192 16384] [--budgets 2 4 8]
        [--png docs/figures/long_context.png]

One training step (forward + backward of the actor's log-prob loss) on one packed sequence of L tokens
(rl_config.use_remove_padding), fp32, a ~17M-parameter model with a 32K vocabulary (4 layers, hidden 256) so
that the head's [tokens, vocabulary] logits weigh what they do in real models relative to the layers. Each
point runs in fresh processes (one per CP rank, one thread each, gloo), so the peak is that step's alone:
  peak   the largest rise of a rank's resident memory (ru_maxrss) over its resident memory before the step
         (after a 64-token warm-up step, so the optimizer's state is already there: activations, logits and
         gradients are what is measured)
  time   the step's wall time / L (the slowest rank)
The last table is the figure users need: the longest sequence whose step fits a memory budget per rank, by
a least-squares line through the measured peaks (memory grows linearly: the attention is the causal SDPA
kernel, never a [L, L] matrix).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODEL = dict(
    num_layers=4,
    hidden_size=256,
    ffn_hidden_size=704,
    num_attention_heads=4,
    group_query_attention=True,
    num_query_groups=2,
    padded_vocab_size=32768,
    untie_embeddings_and_output_weights=True,
    swiglu=True,
    normalization="RMSNorm",
    disable_bias_linear=True,
    add_qkv_bias=True,
)
SETUPS = [("CP 1, whole head", 1, 0), ("CP 1, chunked head", 1, 1024), ("CP 2, whole head", 2, 0),
          ("CP 2, chunked head", 2, 1024)]  # fmt: skip


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _point(rank: int, world: int, port: int, length: int, chunk: int, out: str) -> None:
    """One rank of one measurement: build, then one training step on a sequence of ``length`` tokens."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from mindspeed_rl.config_cls import MegatronConfig, ModelConfig, RoleConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist

    dist.init_distributed(rank, world, master_port=port)
    dist.init_model_parallel(seed=1, cp=world)
    model = ModelConfig(max_position_embeddings=max(length, 1024), **MODEL)
    model.validate()
    megatron = MegatronConfig(model="bench", lr=1e-5, context_parallel_size=world, log_prob_chunk_size=chunk)
    engine = MegatronEngine(
        RoleConfig("actor", megatron, model, world), total_steps=2, remove_padding=True, vocab_size=32768
    )
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(1, 32768, (1, length), generator=g),
        "attention_mask": torch.ones(1, length, dtype=torch.long),
    }

    def loss_fn(outputs, mb):
        loss = -outputs["log_probs"][:, 1:].sum() / (length - 1)
        return loss, {}

    import gc

    warm = {k: v[:, :64] for k, v in batch.items()}  # the optimizer's state and buffers exist before the measure
    engine.train_step(warm, lambda outputs, mb: (-outputs["log_probs"][:, 1:].sum() / 63, {}), micro_batch_size=1)
    gc.collect()
    before = _rss()
    t0 = time.perf_counter()
    engine.train_step(batch, loss_fn, micro_batch_size=1)
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{peak} {elapsed}\n")
    dist.destroy()


def measure(length: int, cp: int, chunk: int, work: str):
    """(peak bytes of the worst rank, seconds of the slowest rank)."""
    import torch.multiprocessing as mp

    from mindspeed_rl.utils.dist import free_port

    out = os.path.join(work, f"point_{length}_{cp}_{chunk}")
    mp.start_processes(_point, args=(cp, free_port(), length, chunk, out), nprocs=cp, join=True, start_method="spawn")
    values = [tuple(map(float, open(f"{out}.{r}").read().split())) for r in range(cp)]
    return max(v[0] for v in values), max(v[1] for v in values)


def longest_fitting(lengths, peaks, budget: float) -> int:
    """The L where a least-squares line through (length, peak) reaches ``budget`` bytes."""
    n = len(lengths)
    mx, my = sum(lengths) / n, sum(peaks) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(lengths, peaks)) / sum((x - mx) ** 2 for x in lengths)
    return int((budget - (my - slope * mx)) / slope)


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--budgets", type=float, nargs="+", default=[2, 4, 8], help="GiB per rank")
    parser.add_argument("--png", default=os.path.join(ROOT, "docs", "figures", "long_context.png"))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for name, cp, chunk in SETUPS:
            for length in args.lengths:
                peak, seconds = measure(length, cp, chunk, work)
                results[(name, length)] = (peak, seconds)
                print(f"{name:<20} L={length:>6}: peak {peak / 2**30:6.2f} GiB/rank, "
                      f"{seconds / length * 1e3:7.3f} ms/token", flush=True)  # fmt: skip
    print("\n| L | " + " | ".join(f"{n}: peak GiB/rank, ms/token" for n, _, _ in SETUPS) + " |")
    print("|---|" + "---|" * len(SETUPS))
    for length in args.lengths:
        cells = [
            f"{results[(n, length)][0] / 2**30:.2f}, {results[(n, length)][1] / length * 1e3:.3f}" for n, _, _ in SETUPS
        ]
        print(f"| {length} | " + " | ".join(cells) + " |")
    print("\nLongest sequence whose training step fits the memory per rank (linear fit):")
    print("| memory per rank | " + " | ".join(n for n, _, _ in SETUPS) + " |")
    print("|---|" + "---|" * len(SETUPS))
    for budget in args.budgets:
        fits = [
            longest_fitting(args.lengths, [results[(n, x)][0] for x in args.lengths], budget * 2**30)
            for n, _, _ in SETUPS
        ]
        print(f"| {budget:g} GiB | " + " | ".join(f"{f:,}" for f in fits) + " |")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (mem, speed) = plt.subplots(1, 2, figsize=(10, 4))
        for name, _, _ in SETUPS:
            mem.plot(args.lengths, [results[(name, x)][0] / 2**30 for x in args.lengths], marker="o", label=name)
            speed.plot(args.lengths, [results[(name, x)][1] / x * 1e3 for x in args.lengths], marker="o", label=name)
        mem.set(xscale="log", xlabel="sequence length (tokens)", ylabel="peak memory per rank (GiB)")
        speed.set(xscale="log", xlabel="sequence length (tokens)", ylabel="training step, ms per token")
        for ax in (mem, speed):
            ax.set_xticks(args.lengths, [f"{x // 1024}K" for x in args.lengths])
            ax.grid(alpha=0.3)
        mem.legend()
        fig.suptitle("One training step on one sequence: 17M-parameter model, 32K vocabulary, fp32, CPU")
        fig.tight_layout()
        os.makedirs(os.path.dirname(args.png), exist_ok=True)
        fig.savefig(args.png, dpi=110)
        print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
