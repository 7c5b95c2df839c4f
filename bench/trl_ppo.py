"""TRL's PPO trainer on the iteration bench/ppo_iteration.py times: the peer the CPU throughput is judged against.

    .venv/bin/pip install --no-deps --target .venv-trl -r requirements/bench-trl.txt     # once
    PYTHONPATH=.venv-trl .venv/bin/python bench/trl_ppo.py [--shape small] [--dtype fp32|bf16] [--iterations 4]

The same work as `bench/ppo_iteration.py --workload fixed`: a randomly initialised Qwen2-shaped policy of the named
shape with a reference copy and a value model of the same shape, the demo set's first `--prompts` questions (13-14
tokens, left-padded) x 1 sample, every response exactly `--new-tokens` tokens (no stop token), one PPO epoch of one
mini-batch, in this process on all its threads. TRL generates with transformers' `generate` (no vLLM) and scores
with a reward model: a one-layer model of the same widths here (the rule reward of ours costs nothing comparable;
its forward is about a quarter of one value forward). The first iteration is a warm-up; the line gives the median of
the others, and tokens/s = responses x (prompt + response) tokens / the iteration's seconds, as e2e_tps counts them.
TRL's `bf16` runs the forward and backward under CPU autocast (fp32 weights and optimizer).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from bench.ppo_iteration import SHAPES  # noqa: E402


def qwen2(shape: dict, layers: int, tokenizer, head: str):
    """A random Qwen2 model of ``shape`` (``layers`` layers): a causal LM, or a one-output scorer (value, reward)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen2Config

    config = Qwen2Config(
        vocab_size=shape["padded_vocab_size"],
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["ffn_hidden_size"],
        num_hidden_layers=layers,
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_query_groups"],
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        num_labels=1,
    )
    cls = AutoModelForCausalLM if head == "lm" else AutoModelForSequenceClassification
    return cls.from_config(config)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=tuple(SHAPES), default="small")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--iterations", type=int, default=4, help="the first is a warm-up")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import __version__ as trl_version
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from mindspeed_rl.demo.assets import make_rows, prepare

    prepare(os.path.join(ROOT, "demo_assets"), SHAPES["tiny"]["padded_vocab_size"])  # the demo tokenizer
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(ROOT, "demo_assets", "tiny_qwen25_hf"), padding_side="left")
    shape = SHAPES[args.shape]
    torch.manual_seed(0)
    policy, reference = (qwen2(shape, shape["num_layers"], tokenizer, "lm") for _ in range(2))
    value, reward = qwen2(shape, shape["num_layers"], tokenizer, "score"), qwen2(shape, 1, tokenizer, "score")
    questions = [row["question"] for row in make_rows(args.prompts, 0)]
    data = Dataset.from_dict({"input_ids": [tokenizer(q)["input_ids"] for q in questions]})

    ends = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="bench_trl_") as out:
        config = PPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts,
            gradient_accumulation_steps=1,
            num_mini_batches=1,
            num_ppo_epochs=1,
            local_rollout_forward_batch_size=args.prompts,
            total_episodes=args.prompts * args.iterations,
            response_length=args.new_tokens,
            stop_token=None,
            temperature=1.0,
            missing_eos_penalty=None,
            bf16=args.dtype == "bf16",
            use_cpu=True,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            num_sample_generations=0,
            seed=0,
        )
        trainer = PPOTrainer(
            args=config,
            processing_class=tokenizer,
            model=policy,
            ref_model=reference,
            reward_model=reward,
            value_model=value,
            train_dataset=data,
            callbacks=[Clock()],
        )
        start = time.perf_counter()
        trainer.train()
    steps = [b - a for a, b in zip([start] + ends, ends)][1:]
    seconds = statistics.median(steps)
    prompt = sum(len(x) for x in data["input_ids"]) / args.prompts
    tokens = args.prompts * (prompt + args.new_tokens)
    print(
        f"TRL {trl_version} PPO, shape {args.shape}, {args.dtype}, {args.prompts} prompts x {args.new_tokens} new "
        f"tokens (prompt {prompt:.1f}), {torch.get_num_threads()} threads: iteration {seconds:.3f} s (median of "
        f"{len(steps)}: {', '.join(f'{s:.2f}' for s in steps)}), {tokens / seconds:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
