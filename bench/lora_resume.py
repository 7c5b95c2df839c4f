"""LoRA exact resume, end to end: PPO (ppo_tiny_cpu) with LoRA on the actor and the critic, started from a base
checkpoint so every checkpoint holds the adapters only; 4 iterations straight == 2, stop, resume
(finetune false), 2 more.

    .venv/bin/python bench/lora_resume.py [--root DIR]

Trains a 2-iteration full-parameter base first (the finetune load of both LoRA runs). Prints the largest
difference of the compared metrics per iteration and of the merged final weights per role (0 is exact), and
what the resumed run's checkpoint stores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

COMPARED = ("critic/score/mean", "actor/pg_loss", "critic/vf_loss", "actor/kl_loss", "grad_norm",
            "response_length/mean", "critic/advantages/mean")  # fmt: skip
LORA = {"actor_config.lora_r": 8, "actor_config.lora_alpha": 16, "critic_config.lora_r": 8,
        "critic_config.lora_alpha": 16, "actor_config.lr": 5e-3}  # fmt: skip


def config(root: str, paths: dict, name: str, iterations: int, **extra):
    from mindspeed_rl.features import load_ppo_config

    overrides = [
        f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
        f"megatron_training.data_path={paths['data_prefix']}",
        f"rl_config.log_dir={root}/logs",
        "megatron_training.test_data_path=null",
        "rl_config.test_freq=0",
        "rl_config.val_before_train=false",
        f"megatron_training.train_iters={iterations}",
        "megatron_training.save_interval=2",
        "megatron_training.global_batch_size=8",
        "rl_config.mini_batch_size=32",
        f"actor_config.save={root}/{name}/actor",
        f"critic_config.save={root}/{name}/critic",
        "actor_config.no_load_optim=false",
        "actor_config.no_load_rng=false",
        "critic_config.no_load_optim=false",
        "critic_config.no_load_rng=false",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_ppo_config("ppo_tiny_cpu", overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None, help="work folder (default: a new temporary one)")
    root = parser.parse_args().root or tempfile.mkdtemp(prefix="lora_resume_")
    import ray

    from mindspeed_rl.checkpoint import megatron_layout as ml
    from mindspeed_rl.checkpoint.megatron_reader import iter_mg_stages
    from mindspeed_rl.demo.assets import prepare
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.launch import train

    paths = prepare(os.path.join(root, "assets"), load_ppo_config("ppo_tiny_cpu").actor.model.padded_vocab_size)
    base = {"actor_config.load": f"{root}/base/actor", "critic_config.load": f"{root}/base/critic"}
    resume = {"actor_config.finetune": "false", "critic_config.finetune": "false",
              "actor_config.load": f"{root}/split/actor", "critic_config.load": f"{root}/split/critic"}  # fmt: skip
    try:
        train(config(root, paths, "base", 2))
        straight = train(config(root, paths, "straight", 4, **LORA, **base))
        split = train(config(root, paths, "split", 2, **LORA, **base))
        split += train(config(root, paths, "split", 4, **LORA, **resume))
    finally:
        ray.shutdown()
    print(f"work folder {root}")
    print("| iteration | largest metric difference, straight vs resumed |")
    print("|---|---|")
    for a, b in zip(straight, split):
        print(f"| {a['iteration']} / {b['iteration']} | {max(abs(a[k] - b[k]) for k in COMPARED):.3g} |")
    for role in ("actor", "critic"):
        merged = [
            {k: v for _, stage in iter_mg_stages(f"{root}/{run}/{role}") for k, v in stage.items()}
            for run in ("straight", "split")
        ]
        worst = max((merged[0][k].float() - merged[1][k].float()).abs().max().item() for k in merged[0])
        _, iter_dir = ml.latest_iteration_dir(f"{root}/split/{role}")
        stored = ml.safe_load(ml.rank_file(iter_dir, 0, 0, 1))
        size = os.path.getsize(ml.rank_file(iter_dir, 0, 0, 1)) / 1e6
        on = stored["config"]["lora"].get("base", {}).get("path")
        print(f"{role}: merged final weights differ by {worst:.3g}; its checkpoint stores {len(stored['model'])} "
              f"tensors ({size:.2f} MB) on the base {on}")  # fmt: skip


if __name__ == "__main__":
    main()
