"""From a validated reward-model training config to a running job: the pair datasets, Ray, the reward model's
worker group on its placement group, the trainer. Failures, restarts and exit codes are PPO's (failures.py)."""

from __future__ import annotations

import os
import sys
import time
from typing import Dict, List

from ..config_cls.rm_config import RMConfig, rm_plan
from ..utils.cli import UserError, raise_if_terminated, stop_on_sigterm
from .failures import WorkerDied, describe_dead_worker, describe_worker_error, train_to_exit_code
from .launch import existing_checkpoint, init_ray, runtime_env_vars, stop_all


def run(cfg: RMConfig) -> int:
    """Train; returns the process exit code (docs/operations.md, "When things go wrong")."""
    with stop_on_sigterm():
        return train_to_exit_code(cfg, train)


def open_pairs(cfg: RMConfig):
    """(training pairs, held-out pairs or None): pairs longer than seq_length (prompt + the longer answer) are
    left out and counted."""
    from ..datasets.pairs import PAIR_FIELDS
    from ..datasets.prompt_dataset import DatasetMissing, PromptDataset

    m = cfg.reward.megatron

    def one(key: str):
        try:
            return PromptDataset(getattr(m, key), (), key=key, token_fields=PAIR_FIELDS, max_length=m.seq_length)
        except DatasetMissing as exc:
            raise UserError(str(exc)) from None

    return one("data_path"), one("test_data_path") if m.test_data_path else None


def preflight(cfg: RMConfig):
    """The reward model's folders and checkpoint, as a PPO run checks its roles; returns the resume's iteration."""
    from .preflight import check_role, resume_iteration

    iteration = resume_iteration(cfg)
    check_role(cfg.reward, iteration, trains=True)
    return iteration


def train(cfg: RMConfig) -> List[Dict[str, float]]:
    import ray

    from ..accelerator import get_accelerator
    from ..config_cls.ppo_config import to_plain
    from ..datasets.prompt_dataset import PromptSampler
    from ..workers.launcher import create_placement_group, spawn_group
    from ..workers.reward_model_worker import RewardModelWorker
    from .loggers import MetricsLogger
    from .report import write_run_info
    from .rm_trainer import RewardModelTrainer

    m, rl = cfg.reward.megatron, cfg.rl
    dataset, test_dataset = open_pairs(cfg)
    if test_dataset is not None and len(test_dataset) < cfg.reward.dp:
        raise UserError(
            f"megatron_training.test_data_path {m.test_data_path}: {len(test_dataset)} held-out pairs for "
            f"{cfg.reward.dp} data-parallel ranks; give at least one pair per rank"
        )
    run_dir = os.path.abspath(os.path.join(rl.log_dir, time.strftime("%Y%m%d-%H%M%S")))
    log_dir = os.path.join(run_dir, "logs") if rl.library_logs == "file" else None
    print(f"run directory: {run_dir} (metrics.jsonl, curves, report.html)", flush=True)
    print(f"pairs: {len(dataset)} from {m.data_path} ({dataset.dropped} over seq_length {m.seq_length})"
          + (f"; held-out pairs: {len(test_dataset)} from {m.test_data_path} ({test_dataset.dropped} over seq_length)"
             if test_dataset else ""), flush=True)  # fmt: skip
    resolved = {k: v for k, v in to_plain(cfg).items() if k != "raw"}
    write_run_info(run_dir, cfg.raw, resolved, rm_plan(cfg), sys.argv)
    started = time.perf_counter()
    resume_at = preflight(cfg)
    raise_if_terminated()
    acc, env = get_accelerator(), runtime_env_vars()
    workers: List = []
    logger = pg = undo_routing = None
    try:
        if log_dir:
            from ..utils.library_logs import route_driver_logs

            undo_routing = route_driver_logs(log_dir)
        init_ray(env, quiet=bool(log_dir))
        devices = cfg.reward.num_devices
        cpus_per_bundle, threads = acc.bundle_cpus(devices)
        pg = create_placement_group(acc, devices, cpus_per_bundle, f"rl_config.reward_resource.num_npus {devices}")
        raise_if_terminated()
        whole_bundle = acc.bundle_spec(cpus_per_bundle)[acc.ray_resource]
        group = spawn_group(
            "reward", RewardModelWorker, acc, pg, devices, whole_bundle,
            lambda rank, addr, port: dict(rank=rank, world_size=devices, master_addr=addr, master_port=port,
                                          threads=threads, role=cfg.reward, rl=rl, total_steps=m.train_iters),
            env, workers, log_dir,
        )  # fmt: skip
        group.load_layouts()
        load = existing_checkpoint(m)
        state = group.call("init_weights", load, m.finetune, not m.no_load_optim, not m.no_load_rng, resume_at)[0]
        start = state.iteration if load and not m.finetune else 0
        sampler = PromptSampler(len(dataset), m.global_batch_size, m.seed, shuffle=not m.no_shuffle)
        logger = MetricsLogger(run_dir, m.train_iters, rl, {"reward": resolved["reward"]["megatron"]})
        trainer = RewardModelTrainer(cfg, group, dataset, sampler, logger, start, test_dataset)
        if start:
            trainer.load_trainer_state(state.trainer_state)
            print(f"resumed at iteration {start} from {m.load} (consumed pairs {sampler.consumed_samples})",
                  flush=True)  # fmt: skip
        print(f"workers ready in {time.perf_counter() - started:.1f}s", flush=True)
        history = trainer.fit()
    except ray.exceptions.RayActorError as exc:
        raise WorkerDied(describe_dead_worker(exc, workers, cfg)) from None
    except ray.exceptions.RayTaskError as exc:
        raise describe_worker_error(exc, workers, cfg, run_dir) from None
    finally:
        if logger is not None:
            logger.close()
        stop_all(workers, pg)
        if undo_routing is not None:
            undo_routing()
    print(f"run directory: {run_dir}", flush=True)
    return history
