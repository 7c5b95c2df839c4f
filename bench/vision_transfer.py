"""Bytes that cross Ray per iteration for the vision twins' rows: the prompts' images as stored (now) against the
pixel tensors per row (before: float32 pixel values and grids, copied into each of a prompt's n rows).

    .venv/bin/python bench/vision_transfer.py [--config grpo_tiny_cpu_vision] [--config ppo_tiny_cpu_vision]

One iteration's rows of each twin (its global_batch_size prompts x n_samples_per_prompt, the task's own pictures
through its own image processor) are pickled as the driver sends them to a worker (Experience.select of the
model inputs); the sends per iteration are the twin's forwards and updates that carry the rows (reference,
old log-probs, values, the actor's and the critic's update). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sends_per_iteration(cfg) -> int:
    """The worker calls of one iteration that carry every row, as PPOTrainer.fit makes them with this config:
    reference, old log-probs, values, the actor's update, the critic's update."""
    from mindspeed_rl.features.algorithm import skips_old_log_prob
    from mindspeed_rl.rollout.source.schedules import round_schedule

    algorithm, rl = cfg.algorithm, cfg.rl
    off_policy = round_schedule(rl, cfg.generate.sampling_config.max_tokens).parks or rl.max_head_offpolicyness > 0
    old_log_probs = not skips_old_log_prob(cfg, off_policy)
    return sum([algorithm.use_reference, old_log_probs, algorithm.use_critic, True, algorithm.use_critic])


def one_iteration(cfg, root: str):
    """The twin's first iteration's rows (fake 4-token responses) and the per-row pixels the old path built."""
    import torch

    from mindspeed_rl.datasets.images import ImageEncoder
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset, PromptSampler, draw_prompts
    from mindspeed_rl.demo.vision_task import make_rows, task_tokenizer, write_prompt_sets
    from mindspeed_rl.protocol import MODEL_INPUTS, RolloutOutput, build_experience
    from mindspeed_rl.protocol.experience_rows import image_fields

    model, n = cfg.actor.model, cfg.rl.n_samples_per_prompt
    tokenizer_dir = os.path.join(root, "tokenizer")
    task_tokenizer(tokenizer_dir, model)
    prompts = cfg.prompts_per_iteration
    write_prompt_sets(root, tokenizer_dir, {"shapes": make_rows(root, "shapes", prompts, 1, False)})
    batch = draw_prompts(PromptDataset(os.path.join(root, "data", "shapes")), PromptSampler(prompts, prompts, 0))
    rng = random.Random(0)
    outputs = [RolloutOutput(i, [rng.randrange(100) for _ in range(4)], [-0.5] * 4, "stop") for i in range(prompts)]
    exp = build_experience(batch.input_ids, [o for o in outputs for _ in range(n)], n, 0, images=batch.images)
    encoder = ImageEncoder(tokenizer_dir)
    pixels = image_fields([encoder.encode(blob) for blob in exp.images])
    sent = exp.select(fields=MODEL_INPUTS)
    as_pixels = {**sent.tensors(), **pixels}  # what the driver sent per row before
    return (
        len(pickle.dumps(sent, protocol=5)),
        len(pickle.dumps(as_pixels, protocol=5)),
        torch.numel(pixels["pixel_values"]),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=None, help="twin configs (default: both)")
    args = parser.parse_args(argv)
    from mindspeed_rl.features import load_ppo_config

    print(
        "| twin | rows | sends / iteration | bytes per send, pixels per row (before) | bytes per send, images as "
        "stored (now) | per iteration, before -> now |"
    )
    print("|---|---|---|---|---|---|")
    for name in args.config or ["grpo_tiny_cpu_vision", "ppo_tiny_cpu_vision"]:
        cfg = load_ppo_config(name, ["dry_run=true"])
        with tempfile.TemporaryDirectory() as root:
            now, before, _ = one_iteration(cfg, root)
        sends = sends_per_iteration(cfg)
        print(
            f"| {name} | {cfg.samples_per_iteration} | {sends} | {before:,} | {now:,} | "
            f"{before * sends / 1e6:.1f} MB -> {now * sends / 1e6:.2f} MB ({before / now:.0f}x) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
