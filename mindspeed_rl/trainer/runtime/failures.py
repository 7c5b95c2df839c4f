"""What a run does when it fails: the exit codes, a dead worker or a worker's exception told in one paragraph
(which role and rank, why, the last checkpoint and the overrides that resume from it), restarts after a dead
worker from the last checkpoint every role completed, and SIGTERM / non-finite / bad-input stops mapped to
their exit codes (docs/operations.md, "When things go wrong")."""

from __future__ import annotations

import os
import re
import sys
from typing import Callable, Dict, List, TypeVar, Union

from ...config_cls.ppo_config import PPOConfig
from ...config_cls.stage_config import StageConfig
from ...utils.cli import TERMINATED_EXIT, USER_ERROR_EXIT, UserError, stopped_by_sigterm
from .guards import NonFiniteStop, TooFewEngines

EXIT_NONFINITE, EXIT_WORKER_DIED, EXIT_WORKER_RAISED, EXIT_TERMINATED = 3, 4, 5, TERMINATED_EXIT


class WorkerDied(RuntimeError):
    """A Ray worker process died; the message says which, the last checkpoint and how to resume."""


RunConfig = Union[PPOConfig, StageConfig]  # a PPO run, or a single-role stage (reward model, SFT)
C = TypeVar("C", PPOConfig, StageConfig)


def train_to_exit_code(cfg: C, train: Callable[[C], List[Dict[str, float]]]) -> int:
    """The process exit code of ``train(cfg)``, with its restarts, under the run lock (a locked folder is a
    UserError): a stop is told in one paragraph on stderr (the codes: docs/operations.md)."""
    import ray

    from ...datasets.prompt_dataset import DatasetMissing
    from ...utils.run_lock import FolderLocked, RunLock

    lock = RunLock(locked_folders(cfg))
    try:
        try:
            lock.acquire()
        except FolderLocked as exc:
            raise UserError(str(exc)) from None
        for note in lock.notes:
            print(f"note: {note}", flush=True)
        history = train_healing(cfg, train)
        return 0 if history else 1
    except NonFiniteStop as exc:
        print(f"stopped: {exc}. {last_checkpoint_text(cfg)}", file=sys.stderr, flush=True)
        return EXIT_NONFINITE
    except WorkerDied as exc:
        print(f"stopped: {exc}", file=sys.stderr, flush=True)
        return EXIT_WORKER_DIED
    except TooFewEngines as exc:
        print(f"stopped: {exc}. {last_checkpoint_text(cfg)}", file=sys.stderr, flush=True)
        return EXIT_WORKER_DIED
    except WorkerRaised as exc:
        print(f"stopped: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT if exc.user_error else EXIT_WORKER_RAISED
    except DatasetMissing as exc:  # a data file damaged under the running job
        print(f"stopped: {exc}. {last_checkpoint_text(cfg)}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    except KeyboardInterrupt as exc:
        if not stopped_by_sigterm(exc):
            raise
        print(f"stopped by SIGTERM: workers shut down. {last_checkpoint_text(cfg)}", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    finally:
        lock.release()
        ray.shutdown()


def train_healing(cfg: C, train: Callable[[C], List[Dict[str, float]]]) -> List[Dict[str, float]]:
    """``train(cfg)``, restarted after a dead worker up to rl_config.max_restarts times: every worker group anew,
    resumed from the last checkpoint every role completed (or from the start when none was saved yet)."""
    import ray

    restarts = 0
    while True:
        try:
            return train(cfg)
        except WorkerDied as exc:
            resumed = resumed_config(cfg) if restarts < cfg.rl.max_restarts else None
            if resumed is None:
                raise
            restarts += 1
            cfg = resumed
            print(f"restart {restarts} of {cfg.rl.max_restarts} (rl_config.max_restarts): {exc}", flush=True)
            ray.shutdown()  # a fresh cluster session: nothing of the dead worker's placement is left


def resumed_config(cfg: C) -> "C | None":
    """``cfg`` resuming from its own saves (finetune false, optimizer and RNG loaded) when every training
    role has saved; ``cfg`` as it is when none has (the restart begins again); None when only some have
    (a restart would pair one role's progress with another's start)."""
    import dataclasses

    from ...checkpoint.megatron_layout import read_tracker_or_none

    roles = cfg.training_roles
    saved = [bool(role.megatron.save) and isinstance(read_tracker_or_none(role.megatron.save), int) for role in roles]
    if not any(saved):
        return cfg
    if not all(saved):
        return None

    def resumed(role):
        m = role.megatron
        return dataclasses.replace(
            role, megatron=dataclasses.replace(m, finetune=False, load=m.save, no_load_optim=False, no_load_rng=False)
        )

    return dataclasses.replace(cfg, **{role.name: resumed(role) for role in roles})


def locked_folders(cfg: RunConfig) -> List:
    """(key, folder) of every folder the run writes: the training roles' saves and the log folder."""
    folders = [(f"{role.name}_config.save", role.megatron.save) for role in cfg.training_roles if role.megatron.save]
    return folders + [("rl_config.log_dir", cfg.rl.log_dir)]


def last_checkpoint_text(cfg: RunConfig) -> str:
    """Where the last good checkpoint is and the overrides that resume from it."""
    from ...checkpoint.megatron_layout import read_tracker_or_none

    first = cfg.training_roles[0].megatron  # the actor (PPO) or the reward model in training
    iteration = read_tracker_or_none(first.save) if first.save else None
    if iteration is None:
        return "No checkpoint was saved yet (megatron_training.save_interval sets how often)."
    return f"Last good checkpoint: {first.save} (iteration {iteration}). Resume by adding: {resume_overrides(cfg)}"


def resume_overrides(cfg: RunConfig) -> str:
    """The overrides that resume this run from its saves: every training role, with its optimizer and RNG
    state (the shipped configs start both afresh), paths quoted for the shell."""
    import shlex

    parts = []
    for role in cfg.training_roles:
        if role.megatron.save:
            section = f"{role.name}_config"
            parts += [
                f"{section}.finetune=false",
                shlex.quote(f"{section}.load={role.megatron.save}"),
                f"{section}.no_load_optim=false",
                f"{section}.no_load_rng=false",
            ]
    return " ".join(parts)


def worker_name(exc, groups) -> str:
    """'the <role> worker of rank <r>' for a Ray error raised by or about one of ``groups``' workers."""
    failed = getattr(exc, "actor_id", None)
    for group in groups:
        for rank, handle in enumerate(group.handles):
            if failed is not None and handle._actor_id.hex() == str(failed):
                return _worker(group.name, rank)
    named = re.search(r"ray::(actor|critic|reward|teacher|rollout\d*)_(\d+)_\d+", str(exc))  # spawn_group's names
    return _worker(named.group(1), int(named.group(2))) if named else "a worker"


def _worker(group: str, rank: int) -> str:
    """A rollout engine's group is ``rollout<engine>``: named by engine and its rank there."""
    engine = re.fullmatch(r"rollout(\d+)", group)
    if engine:
        return f"the rollout worker of engine {engine.group(1)} (its rank {rank})"
    return f"the {group} worker of rank {rank}"


def exception_line(text: str) -> str:
    """The last ``Type: message`` line of a Python traceback in ``text`` (a worker's constructor failing
    arrives as a RayActorError whose text holds the traceback), else its first line."""
    found = re.findall(r"^\s*((?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\w*: .+)$", text, re.MULTILINE)
    if found:
        return found[-1].strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def describe_dead_worker(exc, groups, cfg: RunConfig) -> str:
    """One paragraph: which role and rank died, why (the exception it raised, else the first line), the last
    checkpoint, how to resume."""
    cause = exception_line(str(exc)) or type(exc).__name__
    return f"{worker_name(exc, groups)} died ({cause[:300]}). {last_checkpoint_text(cfg)}"


class WorkerRaised(RuntimeError):
    """A worker's method raised: the message names the worker, the exception's type and message."""

    def __init__(self, message: str, user_error: bool):
        super().__init__(message)
        self.user_error = user_error


def describe_worker_error(exc, groups, cfg: RunConfig, run_dir: str) -> WorkerRaised:
    """A RayTaskError as one paragraph: who raised what, the last checkpoint, where the whole traceback is
    (written to ``<run dir>/worker_error.txt``); bad input (a checkpoint, a file, the disk) is exit 2."""
    from ...checkpoint.megatron_layout import CheckpointError
    from ...config_cls.base import ConfigError

    cause = getattr(exc, "cause", None) or exc
    message = str(cause).strip().splitlines()[0][:500] if str(cause).strip() else ""
    path = os.path.join(run_dir, "worker_error.txt")
    try:
        os.makedirs(run_dir, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(str(exc))
    except OSError:
        path = "not written: " + path
    user = isinstance(cause, (CheckpointError, ConfigError, UserError))
    return WorkerRaised(
        f"{worker_name(exc, groups)} raised {type(cause).__name__}: {message}. "
        f"{last_checkpoint_text(cfg)} (traceback: {path})",
        user,
    )
