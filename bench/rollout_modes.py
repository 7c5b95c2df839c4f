"""Rollout modes and their combinations, side by side at equal slots, on a fixed and on a long-tail workload.

    .venv/bin/python bench/rollout_modes.py [--iterations 6] [--modes sync partial async ...] [--workloads ...]

The GRPO twin (16 prompts x 8 samples) through `cli/train_ppo.py` (the user's command). Every mode runs on the
same two slots, the actor on one and a rollout worker on the other (`rl_config.rollout_resource`), so the
modes differ only in how batches are produced (rollout/source/rollout_source.py):
  sync        generate the batch, then train on it
  partial     partial_rollout_max_split (chunks of max_tokens / split; unfinished responses parked)
  async       max_head_offpolicyness 1 (the next batch is produced while the actor trains)
  async2      max_head_offpolicyness 2 (each weight update waits for both batches in flight)
  fully_async max_head_offpolicyness 2 with in-flight weight updates (rl_config.async_training; staleness bound 2):
              the rollout worker never waits for training, the weights reach it between two engine steps
  ds          dynamic sampling (filter_groups: groups all right or all wrong are dropped, more prompts drawn;
              8 groups of the 16 drawn, at most 3 draws)
  and the combinations ds+partial, ds+async, partial+async, ds+partial+async
Workloads:
  fixed     every prompt may answer in --fixed-tokens tokens
  long-tail 1 prompt in 8 may answer in --long-tokens tokens, the others in --short-tokens
            (demo.assets.prepare_long_tail: the dataset key max_new_tokens)
--engine-seqs caps the sequences the rollout engine runs at once (generate_config.max_num_seqs): a small engine makes
generation the longer part, as at scale, where the asynchronous modes differ.
Prints a markdown table of medians over iterations 2..N: step (timing/all), e2e_tps, generated tokens per second
(response tokens / step), generation (timing/rollout, summed over a batch's rounds), trainer idle
(timing/trainer_idle: the trainer waiting for its batch, and in async for the productions in flight before a weight
update) and its share of the step, the engines' idle share (timing/engine_idle_share), staleness, the share of
answers sampled by two versions, response length, and the whole command's wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.train_run import train  # noqa: E402

LAYERS = {
    "partial": ["rl_config.partial_rollout_max_split={split}"],
    "async": ["rl_config.max_head_offpolicyness=1"],
    "async2": ["rl_config.max_head_offpolicyness=2"],
    "fully_async": [
        "rl_config.max_head_offpolicyness=2",
        "rl_config.async_training.in_flight_weight_updates=true",
        "rl_config.async_training.max_staleness=2",
    ],
    "ds": [
        "rl_config.filter_groups_enable=true",
        "rl_config.filter_groups_metric=acc_for_ppo",
        "rl_config.filter_groups_max_batches=3",
        "rl_config.filter_groups_train_batch_size=8",
        "rl_config.mini_batch_size=64",
    ],
}
MODES = [
    "sync", "partial", "async", "ds", "ds+partial", "ds+async", "partial+async", "ds+partial+async",
    "async2", "fully_async",
]  # fmt: skip


def run(mode: str, workload: dict, iterations: int, work: str, split: int, engine_seqs: int = 0) -> dict:
    extra = ["rl_config.rollout_resource.num_npus=1"]  # equal slots: one actor slot, one rollout slot
    for layer in mode.split("+"):
        extra += LAYERS.get(layer, [])
    out = os.path.join(work, f"{mode.replace('+', '_')}_{workload['name']}")
    overrides = [
        f"megatron_training.train_iters={iterations}",
        f"rl_config.log_dir={out}/logs",
        f"actor_config.save={out}/actor",
        "megatron_training.save_interval=1000",
        "megatron_training.test_data_path=null",
        "rl_config.test_freq=0",
        "rl_config.val_before_train=false",
        f"megatron_training.tokenizer_name_or_path={workload['tokenizer']}",
        f"megatron_training.data_path={workload['data']}",
        f"generate_config.sampling_config.max_tokens={workload['max_tokens']}",
        f"megatron_training.dataset_additional_keys={workload['keys']}",
    ]
    overrides += [e.format(split=split) for e in extra]
    if engine_seqs:
        overrides.append(f"generate_config.max_num_seqs={engine_seqs}")
    done = train("grpo_tiny_cpu", overrides, f"{mode} on {workload['name']}")
    rows = [r for r in done.rows if "timing/all" in r][1:] or done.rows
    responses = (8 if "ds" in mode.split("+") else 16) * 8  # trained groups x n_samples_per_prompt

    def median(fn):
        return statistics.median(fn(r) for r in rows)

    return {
        "step": median(lambda r: r["timing/all"]),
        "e2e_tps": median(lambda r: r["e2e_tps"]),
        "tokens/s": median(lambda r: r["response_length/mean"] * responses / r["timing/all"]),
        "generation": median(lambda r: r.get("timing/rollout", 0.0)),
        "trainer idle": median(lambda r: r.get("timing/trainer_idle", 0.0)),
        "idle share": median(lambda r: r.get("timing/trainer_idle", 0.0) / r["timing/all"]),
        "engine idle": median(lambda r: r.get("timing/engine_idle_share", 0.0)),
        "staleness": median(lambda r: r.get("rollout/staleness_mean", 0.0)),
        "mixed": median(lambda r: r.get("rollout/mixed_version_share", 0.0)),
        "length": median(lambda r: r["response_length/mean"]),
        "wall": done.wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    p.add_argument("--workloads", nargs="+", default=["fixed", "long-tail"], choices=["fixed", "long-tail"])
    p.add_argument("--fixed-tokens", type=int, default=16)
    p.add_argument("--short-tokens", type=int, default=4)
    p.add_argument("--long-tokens", type=int, default=32)
    p.add_argument("--split", type=int, default=4, help="partial_rollout_max_split of the partial mode")
    p.add_argument("--engine-seqs", type=int, default=0, help="generate_config.max_num_seqs (0: the config's)")
    args = p.parse_args()
    from mindspeed_rl.demo.assets import prepare, prepare_long_tail
    from mindspeed_rl.features import load_ppo_config

    with tempfile.TemporaryDirectory(prefix="bench_rollout_modes_") as work:
        vocab = load_ppo_config("grpo_tiny_cpu").actor.model.padded_vocab_size
        paths = prepare(os.path.join(work, "assets"), vocab)
        long_tail = prepare_long_tail(os.path.join(work, "assets"), vocab, args.short_tokens, args.long_tokens)
        workloads = [
            dict(
                name="fixed",
                data=paths["data_prefix"],
                tokenizer=paths["tokenizer"],
                max_tokens=args.fixed_tokens,
                keys="[labels]",
            ),
            dict(
                name="long-tail",
                data=long_tail,
                tokenizer=paths["tokenizer"],
                max_tokens=args.long_tokens,
                keys="[labels,max_new_tokens]",
            ),
        ]
        workloads = [w for w in workloads if w["name"] in args.workloads]
        results = {
            (w["name"], m): run(m, w, args.iterations, work, args.split, args.engine_seqs)
            for w in workloads
            for m in args.modes
        }
    columns = (
        "step", "e2e_tps", "tokens/s", "generation", "trainer idle", "idle share", "engine idle", "staleness", "mixed",
        "length", "wall",
    )  # fmt: skip
    print("| workload | mode | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for (workload, mode), r in results.items():
        print(f"| {workload} | {mode} | " + " | ".join(f"{r[c]:.3g}" for c in columns) + " |")


if __name__ == "__main__":
    main()
