"""From a validated single-role stage config (reward-model training, SFT, DPO) to a running job: the datasets, Ray, the
role's worker group on its placement group, the stage's trainer. Failures, restarts and exit codes are PPO's
(failures.py)."""

from __future__ import annotations

import sys
import time
from typing import Dict, List, Tuple, Type

from ...config_cls.stage_config import StageConfig
from ...utils.cli import UserError, raise_if_terminated, stop_on_sigterm
from ...workers.launcher import RunFrame
from ..runtime.failures import train_to_exit_code
from ..runtime.ray_run import new_run_dir, ray_run
from ..startup.plan import stage_plan
from .stage_trainer import StageTrainer


def run(cfg: StageConfig) -> int:
    """Train; returns the process exit code (docs/operations.md, "When things go wrong")."""
    with stop_on_sigterm():
        return train_to_exit_code(cfg, train)


def stage_parts(cfg: StageConfig) -> Tuple[type, Type[StageTrainer]]:
    """The stage's worker class and trainer class, as its ``Stage`` names them (``module:Class``)."""
    from ...utils.plugins import import_named

    return import_named(cfg.stage.worker), import_named(cfg.stage.trainer)


def open_datasets(cfg: StageConfig, trainer: Type[StageTrainer]):
    """(training set, held-out set or None): rows longer than seq_length are left out and counted."""
    from ...datasets.prompt_dataset import DatasetMissing

    m = cfg.role.megatron

    def one(key: str):
        try:
            return trainer.open_dataset(getattr(m, key), key, m.seq_length)
        except DatasetMissing as exc:
            raise UserError(str(exc)) from None

    return one("data_path"), one("test_data_path") if m.test_data_path and cfg.validates else None


def preflight(cfg: StageConfig):
    """The role's folders and checkpoint, as a PPO run checks its roles; returns the resume's iteration."""
    from ..startup.preflight import check_role, resume_iteration

    iteration = resume_iteration(cfg)
    check_role(cfg.role, iteration, trains=True)
    return iteration


def train(cfg: StageConfig) -> List[Dict[str, float]]:
    from ...config_cls.ppo_config import to_plain
    from ...datasets.prompt_dataset import PromptSampler
    from ..report.loggers import MetricsLogger
    from ..report.report import write_run_info
    from ..startup.precision import settle_run_precision

    settle_run_precision(cfg)  # settled by the entry point already; a config built in code settles here
    m, rl, unit = cfg.role.megatron, cfg.rl, cfg.stage.unit
    worker_cls, trainer_cls = stage_parts(cfg)
    dataset, test_dataset = open_datasets(cfg, trainer_cls)
    if test_dataset is not None and len(test_dataset) < cfg.role.dp:
        raise UserError(
            f"megatron_training.test_data_path {m.test_data_path}: {len(test_dataset)} held-out {unit} for "
            f"{cfg.role.dp} data-parallel ranks; give at least one per rank"
        )
    run_dir, log_dir = new_run_dir(rl)
    print(f"run directory: {run_dir} (metrics.jsonl, curves, report.html)", flush=True)
    held_out = ""
    if test_dataset is not None:
        held_out = (
            f"; held-out {unit}: {len(test_dataset)} from {m.test_data_path} ({test_dataset.dropped} over seq_length)"
        )
    print(
        f"{unit}: {len(dataset)} from {m.data_path} ({dataset.dropped} over seq_length {m.seq_length}){held_out}",
        flush=True,
    )
    resolved = {k: v for k, v in to_plain(cfg).items() if k not in ("raw", "stage")}
    write_run_info(run_dir, cfg.raw, resolved, stage_plan(cfg), sys.argv)
    started = time.perf_counter()
    resume_at = preflight(cfg)
    raise_if_terminated()
    devices = cfg.role.num_devices
    with ray_run(cfg, run_dir, log_dir, devices, f"rl_config.{cfg.stage.resource}.num_npus {devices}") as frame:
        group = start_group(cfg, frame, worker_cls)
        load = m.load or None
        state = group.call("init_weights", load, m.finetune, not m.no_load_optim, not m.no_load_rng, resume_at)[0]
        start = state.iteration if load and not m.finetune else 0
        sampler = PromptSampler(len(dataset), m.global_batch_size, m.seed, shuffle=not m.no_shuffle)
        logger = MetricsLogger(run_dir, m.train_iters, rl, {cfg.role.name: resolved["role"]["megatron"]})
        frame.on_exit(logger.close)
        trainer = trainer_cls(cfg, group, dataset, sampler, logger, start, test_dataset)
        if start:
            trainer.load_trainer_state(state.trainer_state)
            print(
                f"resumed at iteration {start} from {m.load} (consumed {unit} {sampler.consumed_samples})", flush=True
            )
        print(f"workers ready in {time.perf_counter() - started:.1f}s", flush=True)
        history = trainer.fit()
    print(f"run directory: {run_dir}", flush=True)
    return history


def start_group(cfg: StageConfig, frame: RunFrame, worker_cls: type):
    """The role's worker group, one rank per bundle of the run's placement group."""
    from ...workers.launcher import spawn_group

    devices, acc = cfg.role.num_devices, frame.acc
    cpus_per_bundle, threads = acc.bundle_cpus(devices)
    whole_bundle = acc.bundle_spec(cpus_per_bundle)[acc.ray_resource]
    kwargs = dict(role=cfg.role, rl=cfg.rl, total_steps=cfg.role.megatron.train_iters)
    if cfg.dpo is not None:
        kwargs["dpo"] = cfg.dpo
    # spawn_group waits: every rank is built and its layout read when it returns
    return spawn_group(frame, cfg.role.name, worker_cls, devices, whole_bundle, threads, kwargs)
