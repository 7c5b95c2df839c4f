"""The frame every training launch runs in (PPO's launch.py, the single-role stages' stage_launch.py): the run
directory, the libraries' logs routed, Ray started (or joined), a placement group, the worker groups recorded as
they start; a worker's death or exception translated into one paragraph (failures.py), and on the way out
everything closed, the workers shut down (killed after a grace) and the logs routed back."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

from ...compat import ray_gcs
from ...config_cls.loader import CONFIG_DIR
from ...rollout.service import EngineFailed
from ...utils.cli import UserError, raise_if_terminated, raise_terminated
from .failures import WorkerDied, describe_dead_worker, describe_worker_error, last_checkpoint_text

if TYPE_CHECKING:
    from ...workers.launcher import RunFrame


def runtime_env_vars() -> Dict[str, str]:
    from ...config_cls.yaml_guard import load_yaml

    data = load_yaml(os.path.join(CONFIG_DIR, "envs", "runtime_env.yaml")) or {}
    env = {k: str(v) for k, v in (data.get("env_vars") or {}).items()}
    for key in ("MINDSPEED_RL_DEVICE", "PYTHONWARNINGS", "MINDSPEED_RL_INJECT_FAULTS"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


RAY_JOIN_TIMEOUT_S = 10.0  # seconds the cluster at RAY_ADDRESS has to accept a connection
JOIN_TIMEOUT_ENV = "MINDSPEED_RL_RAY_JOIN_TIMEOUT"  # overrides it
JOIN_HINT = (
    "start the cluster with `ray start --head` and set RAY_ADDRESS to the address it prints, or unset RAY_ADDRESS "
    "to start Ray inside this run"
)


def join_timeout() -> float:
    """The seconds a cluster at RAY_ADDRESS has to answer: MINDSPEED_RL_RAY_JOIN_TIMEOUT, else 10."""
    given = os.environ.get(JOIN_TIMEOUT_ENV, "")
    try:
        seconds = float(given) if given else RAY_JOIN_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise UserError(f"{JOIN_TIMEOUT_ENV}={given!r}: not a positive number of seconds")
    return seconds


def check_ray_address(address: str, seconds: float) -> None:
    """Refuse an ``address`` (RAY_ADDRESS: host:port, or ray://host:port) where no Ray cluster answers within
    ``seconds``: ray.init would retry there for many minutes. Nothing may accept a TCP connection there, and at
    host:port a Ray GCS must tell its cluster id (an intercepting proxy accepts any connection, and a server of
    another kind may listen). "auto" and "local" are Ray's to settle."""
    if address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"RAY_ADDRESS={address!r} is not host:port (e.g. 10.0.0.1:6379): {JOIN_HINT}")
    import socket

    waited = f"no answer within {seconds:g} s; {JOIN_TIMEOUT_ENV} sets how long"
    until = time.monotonic() + seconds
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=seconds):
            pass
        why = None if "://" in address else ray_gcs.gcs_silence(address, max(0.1, until - time.monotonic()), waited)
    except (OSError, OverflowError) as exc:
        why = waited if isinstance(exc, socket.timeout) else (getattr(exc, "strerror", None) or str(exc)).lower()
    if why:
        raise UserError(f"RAY_ADDRESS={address}: no Ray cluster answers there ({why}): {JOIN_HINT}")


def init_ray(env: Dict[str, str], quiet: bool = False) -> None:
    """Start (or join, with RAY_ADDRESS: refused in seconds where nothing answers) Ray; ``quiet`` leaves Ray's
    driver logger to the handlers of ``library_logs.route_driver_logs``."""
    import ray

    if ray.is_initialized():
        return
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # no ANSI colour in the worker-log prefix of a log file
    address = os.environ.get("RAY_ADDRESS")
    if address:
        check_ray_address(address, join_timeout())
    kwargs = dict(
        runtime_env={"env_vars": env},
        include_dashboard=False,
        log_to_driver=True,
        logging_level="WARNING",
        configure_logging=not quiet,
    )
    import signal
    import threading

    from ray._private import utils as ray_utils

    own_handler = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if own_handler else None
    # ray.init installs a SIGTERM handler of its own (sys.exit(15)) while it runs; raised inside a lock release or
    # a __del__, that SystemExit is dropped and the process runs on. The process's handler stays instead: it
    # records the signal, so raise_if_terminated raises it again when ray.init returns.
    set_handler = getattr(ray_utils, "set_sigterm_handler", None)
    keep_ours = own_handler and set_handler is not None and previous is raise_terminated
    if keep_ours:
        ray_utils.set_sigterm_handler = lambda handler: None
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=os.cpu_count(), **kwargs)
    except SystemExit as exc:  # ray.init's own SIGTERM handler, where it was installed, calls sys.exit(15)
        if exc.code != signal.SIGTERM:
            raise
        raise_terminated(signal.SIGTERM, None)
    except ConnectionError as exc:  # e.g. RAY_ADDRESS=auto and no cluster on this machine
        if not address:
            raise
        raise UserError(f"RAY_ADDRESS={address}: {str(exc).rstrip('.')}; {JOIN_HINT}") from None
    finally:
        if keep_ours:
            ray_utils.set_sigterm_handler = set_handler
        if own_handler:  # a handler ray.init installed (exit 15) gives way to the process's
            signal.signal(signal.SIGTERM, previous)
    raise_if_terminated()


def describe_placement(pg) -> str:
    from ray.util.placement_group import placement_group_table

    nodes = placement_group_table(pg).get("bundles_to_node_id", {})
    return f"placement group: {len(nodes)} bundle(s) on {len(set(nodes.values()))} node(s)"


SHUTDOWN_GRACE_S = 5.0  # then workers still busy (starting up, stuck in a collective) are killed


def stop_all(workers: List, pg, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Every worker group asked to shut down (all at once), and its processes killed now (not when the handles
    are collected) or after ``grace_s``: a shutdown queues behind the call a worker is in, e.g. its start-up,
    which a SIGTERM must not wait out."""
    import ray

    asked = [ref for group in workers for ref in group.call_async("shutdown")]
    if asked:
        ray.wait(asked, num_returns=len(asked), timeout=grace_s)  # a dead worker's answer is its error: ready
    for group in workers:
        for handle in group.handles:
            ray.kill(handle, no_restart=True)
    if pg is not None:
        ray.util.remove_placement_group(pg)


def new_run_dir(rl) -> "tuple[str, Optional[str]]":
    """(this run's folder under rl_config.log_dir, its folder for the libraries' logs or None)."""
    run_dir = os.path.abspath(os.path.join(rl.log_dir, time.strftime("%Y%m%d-%H%M%S")))
    return run_dir, os.path.join(run_dir, "logs") if rl.library_logs == "file" else None


@contextmanager
def ray_run(cfg, run_dir: str, log_dir: Optional[str], bundles: int, keys: str) -> "Iterator[RunFrame]":
    """Ray and a placement group of ``bundles`` (``keys``: the config keys that size it, for its messages)."""
    import ray

    from ...accelerator import get_accelerator
    from ...workers.launcher import RunFrame, create_placement_group

    frame = RunFrame(get_accelerator(), runtime_env_vars(), log_dir)
    undo_routing = None
    try:
        if log_dir:
            from ...utils.library_logs import route_driver_logs

            undo_routing = route_driver_logs(log_dir)
        init_ray(frame.env, quiet=bool(log_dir))
        frame.pg = create_placement_group(frame.acc, bundles, frame.acc.bundle_cpus(bundles)[0], keys)
        print(describe_placement(frame.pg), flush=True)
        raise_if_terminated()
        yield frame
    except ray.exceptions.RayActorError as exc:
        raise WorkerDied(describe_dead_worker(exc, frame.workers, cfg)) from None
    except EngineFailed as exc:  # a rollout engine passed a deadline, died or answered garbage
        raise WorkerDied(f"{exc}. {last_checkpoint_text(cfg)}") from None
    except ray.exceptions.RayTaskError as exc:
        raise describe_worker_error(exc, frame.workers, cfg, run_dir) from None
    finally:
        for close in reversed(frame.closers):
            close()
        stop_all(frame.workers, frame.pg)
        if undo_routing is not None:
            undo_routing()
