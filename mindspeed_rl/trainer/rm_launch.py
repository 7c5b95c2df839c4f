"""From a validated reward-model training config to a running job: the pair datasets, Ray, the reward model's
worker group on its placement group, the trainer. Failures, restarts and exit codes are PPO's (failures.py)."""

from __future__ import annotations

import sys
import time
from typing import Dict, List

from ..config_cls.rm_config import RMConfig
from ..utils.cli import UserError, raise_if_terminated, stop_on_sigterm
from ..workers.launcher import RunFrame
from .failures import train_to_exit_code
from .plan import rm_plan
from .ray_run import new_run_dir, ray_run


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

    return one("data_path"), one("test_data_path") if m.test_data_path and cfg.validates else None


def preflight(cfg: RMConfig):
    """The reward model's folders and checkpoint, as a PPO run checks its roles; returns the resume's iteration."""
    from .preflight import check_role, resume_iteration

    iteration = resume_iteration(cfg)
    check_role(cfg.reward, iteration, trains=True)
    return iteration


def train(cfg: RMConfig) -> List[Dict[str, float]]:
    from ..config_cls.ppo_config import to_plain
    from ..datasets.prompt_dataset import PromptSampler
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
    run_dir, log_dir = new_run_dir(rl)
    print(f"run directory: {run_dir} (metrics.jsonl, curves, report.html)", flush=True)
    held_out = f"; held-out pairs: {len(test_dataset)} from {m.test_data_path} ({test_dataset.dropped} over seq_length)"
    print(
        f"pairs: {len(dataset)} from {m.data_path} ({dataset.dropped} over seq_length {m.seq_length})"
        f"{held_out if test_dataset else ''}",
        flush=True,
    )
    resolved = {k: v for k, v in to_plain(cfg).items() if k != "raw"}
    write_run_info(run_dir, cfg.raw, resolved, rm_plan(cfg), sys.argv)
    started = time.perf_counter()
    resume_at = preflight(cfg)
    raise_if_terminated()
    devices = cfg.reward.num_devices
    with ray_run(cfg, run_dir, log_dir, devices, f"rl_config.reward_resource.num_npus {devices}") as frame:
        group = start_reward_model(cfg, frame)
        load = m.load or None
        state = group.call("init_weights", load, m.finetune, not m.no_load_optim, not m.no_load_rng, resume_at)[0]
        start = state.iteration if load and not m.finetune else 0
        sampler = PromptSampler(len(dataset), m.global_batch_size, m.seed, shuffle=not m.no_shuffle)
        logger = MetricsLogger(run_dir, m.train_iters, rl, {"reward": resolved["reward"]["megatron"]})
        frame.on_exit(logger.close)
        trainer = RewardModelTrainer(cfg, group, dataset, sampler, logger, start, test_dataset)
        if start:
            trainer.load_trainer_state(state.trainer_state)
            print(f"resumed at iteration {start} from {m.load} (consumed pairs {sampler.consumed_samples})", flush=True)
        print(f"workers ready in {time.perf_counter() - started:.1f}s", flush=True)
        history = trainer.fit()
    print(f"run directory: {run_dir}", flush=True)
    return history


def start_reward_model(cfg: RMConfig, frame: RunFrame):
    """The reward model's worker group, one rank per bundle of the run's placement group."""
    from ..workers.launcher import spawn_group
    from ..workers.reward_model_worker import RewardModelWorker

    devices, acc = cfg.reward.num_devices, frame.acc
    cpus_per_bundle, threads = acc.bundle_cpus(devices)
    whole_bundle = acc.bundle_spec(cpus_per_bundle)[acc.ray_resource]
    kwargs = dict(role=cfg.reward, rl=cfg.rl, total_steps=cfg.reward.megatron.train_iters)
    # spawn_group waits: every rank is built and its layout read when it returns
    return spawn_group(frame, "reward", RewardModelWorker, devices, whole_bundle, threads, kwargs)
