"""Start-up of a run, phase by phase: Ray, the placement group, the roles' worker groups (process start, torch /
megatron-core / vLLM imports, models, rollout engines), weights. The roles start side by side where the
accelerator allows it (``roles_start_together``: the CPU); ``--one-at-a-time`` times the order the devices use.

    .venv/bin/python bench/startup.py [--configs ppo_tiny_cpu grpo_tiny_cpu] [--repeats 3] [--one-at-a-time]

Every repeat joins one Ray (started by the first), as the runs of one driver do; the table gives medians.
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


def config_for(name: str, root: str):
    from mindspeed_rl.demo.assets import prepare
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.startup.config_names import load_run_config

    paths = prepare(os.path.join(root, "assets"), load_ppo_config(name).actor.model.padded_vocab_size)
    return load_run_config(  # precision settled as a run's is
        name,
        [
            f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
            f"megatron_training.data_path={paths['data_prefix']}",
            "megatron_training.test_data_path=null",
            "rl_config.test_freq=0",
            "rl_config.val_before_train=false",
            f"rl_config.log_dir={root}/logs",
            f"actor_config.save={root}/ckpt/actor",
            f"critic_config.save={root}/ckpt/critic",
        ],
    )


def start_once(cfg, one_at_a_time: bool) -> dict:
    """Seconds of each start-up phase of ``cfg`` (the workers stopped afterwards)."""
    from mindspeed_rl.accelerator import get_accelerator
    from mindspeed_rl.trainer import launch
    from mindspeed_rl.trainer.runtime import ray_run
    from mindspeed_rl.utils.hf_tokenizer import load_tokenizer
    from mindspeed_rl.workers.launcher import RunFrame, create_placement_group

    frame = RunFrame(get_accelerator(), ray_run.runtime_env_vars(), None)
    if one_at_a_time:
        frame.acc.roles_start_together = False
    tokenizer = load_tokenizer(cfg.actor.megatron.tokenizer_name_or_path, "tokenizer")
    phases = {}
    mark = time.perf_counter()

    def lap(name):
        nonlocal mark
        now = time.perf_counter()
        phases[name], mark = now - mark, now

    try:
        ray_run.init_ray(frame.env)
        lap("ray")
        bundles = cfg.world_size
        frame.pg = create_placement_group(frame.acc, bundles, frame.acc.bundle_cpus(bundles)[0], "bench")
        lap("placement")
        roles = launch.start_roles(cfg, frame, tokenizer, cfg.rl.log_dir)
        lap("roles")
        launch.load_models(cfg, roles, None)
        lap("weights")
    finally:
        ray_run.stop_all(frame.workers, frame.pg)
    phases["total"] = sum(phases.values())
    return phases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["ppo_tiny_cpu", "grpo_tiny_cpu"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one-at-a-time", action="store_true", help="build the roles one after another")
    args = parser.parse_args(argv)
    order = "one after another" if args.one_at_a_time else "side by side where the accelerator allows"
    print(f"roles started {order}; medians of {args.repeats} (the first run also starts Ray)")
    print("| config | ray | placement | roles | weights | total |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for name in args.configs:
            cfg = config_for(name, root)
            runs = [start_once(cfg, args.one_at_a_time) for _ in range(args.repeats)]
            cells = [f"{statistics.median(r[k] for r in runs):.1f} s" for k in runs[0]]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
