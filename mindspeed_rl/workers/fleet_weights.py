"""Weights into the rollout fleet (``workers/rollout_fleet.py``): the engines that failed started again, the
actor's stream to every engine in service within rl_config.rollout_fault_tolerance.weight_sync_timeout_s (an engine
whose stream breaks or that does not answer leaves service and restarts at once), and with in-flight updates the
pause before and the resume after, all engines together."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, List, Optional, Set

from ..rollout.service import EngineFailed
from ..utils.cli import first_line
from .engine_health import KEY, settled

if TYPE_CHECKING:
    from .rollout_fleet import Engine, RolloutFleet


def sync_weights(
    fleet: "RolloutFleet", actor, version: int, pause_timeout_s: Optional[float] = None, recompute=False
) -> None:
    """The actor's weights of ``version`` into every engine in service, engines out of service restarted first
    (while restarts remain) so that they hold them too. ``pause_timeout_s`` (in-flight updates): the engines
    pause first and resume after, all together."""
    import ray

    for engine in fleet.engines:
        if engine.down:
            ray.get(actor.call_async("close_weight_channel", engine.index))
    joining = restart_down(fleet, actor, fleet.engines)  # before the pause: the others generate meanwhile
    if pause_timeout_s is not None:
        pause_all(fleet, pause_timeout_s)
    targets = fleet.serving() + joining
    while targets:
        failed = push(fleet, actor, version, targets)
        with fleet.lock:
            for engine in targets:
                engine.serving = not engine.down
        targets = restart_down(fleet, actor, failed)
    fleet.check_minimum("after the weight sync")
    if pause_timeout_s is not None:
        ray.get(fleet.call_async("resume_generation", recompute))


def pause_all(fleet: "RolloutFleet", timeout: float) -> None:
    """Every engine in service paused within the deadline (the worker's PauseTimeout names one that did not)."""
    import ray

    engines = fleet.serving()
    refs = [engine.group.call_async("pause_generation", timeout) for engine in engines]
    flat = [ref for group in refs for ref in group]
    done = settled(flat, timeout + 30.0)
    for engine, group_refs in zip(engines, refs):
        if not done.issuperset(group_refs):
            why = f"no answer within {timeout:g} s (+ 30 s)"
            fleet.fail(engine, "the pause for a weight update", why, "rl_config.async_training.pause_timeout_s")
            continue
        try:
            ray.get(group_refs)
        except ray.exceptions.RayError as exc:  # died, or its step did not end (the worker's PauseTimeout)
            if not fleet.limits.enabled or not died_or_stuck(exc):
                raise
            fleet.fail(engine, "the pause for a weight update", first_line(exc), KEY)


def push(fleet: "RolloutFleet", actor, version: int, targets: List[Engine]) -> List[Engine]:
    """One stream to ``targets``; returns those that failed during it (taken out of service)."""
    import ray

    sending = actor.call_async("push_weights", [engine.index for engine in targets])
    receiving = [engine.group.call_async("receive_weights", version) for engine in targets]
    began, limit = time.monotonic(), fleet.limits.weight_sync_timeout_s
    deadline = limit * len(targets) + 30.0  # the sender waits out each engine in turn
    if not settled(sending, deadline).issuperset(sending):
        raise EngineFailed(
            f"the actor did not finish streaming the weights within {deadline:g} s ({KEY}.weight_sync_timeout_s "
            f"{limit:g} per engine)"
        )
    broken = ray.get(sending)[0].get("failed", {})
    # the others' loads end with the stream; a receiver that hangs has what is left of the deadline (5 s at least)
    loading = [ref for engine, refs in zip(targets, receiving) if engine.index not in broken for ref in refs]
    done = settled(loading, max(5.0, limit - (time.monotonic() - began)))
    failed = []
    for engine, refs in zip(targets, receiving):
        why = receive_problem(fleet, refs, done, broken.get(engine.index))
        if why is not None:
            fleet.fail(engine, "a weight sync", why, f"{KEY}.weight_sync_timeout_s")
            failed.append(engine)
    return failed


def receive_problem(fleet: "RolloutFleet", refs: List[Any], done: Set[Any], sender_saw: Optional[str]) -> Optional[str]:
    """Why an engine did not load the stream: no answer, its process died, or the stream to it broke."""
    import ray

    if sender_saw:
        return f"the stream to it broke: {sender_saw}"
    if not done.issuperset(refs):
        return f"no answer within {fleet.limits.weight_sync_timeout_s:g} s"
    try:
        ray.get(refs)
    except ray.exceptions.RayActorError as exc:
        if not fleet.limits.enabled:
            raise
        return f"its process died ({first_line(exc)})"
    return None


def restart_down(fleet: "RolloutFleet", actor, engines: List[Engine]) -> List[Engine]:
    """``engines`` that failed, started again while restarts remain: their ranks, model and weight channel
    within setup_timeout_s; they serve once the next stream reached them. Returns those started."""
    if fleet.respawn is None:
        return []
    started = []
    for engine in engines:
        if engine.down and engine.restarts < fleet.limits.max_restarts_per_engine:
            if restart(fleet, actor, engine):
                started.append(engine)
    return started


def restart(fleet: "RolloutFleet", actor, engine: Engine) -> bool:
    import ray

    began = time.monotonic()
    engine.restarts += 1
    fleet.counts.restarts += 1
    group = fleet.respawn(engine.index, engine.restarts)
    try:
        group.load_layouts(fleet.limits.setup_timeout_s, f"{KEY}.setup_timeout_s")
        engine.group = group
        fleet.connect(actor, engine)
    except (TimeoutError, EngineFailed, ray.exceptions.RayError) as exc:
        for handle in group.handles:
            ray.kill(handle, no_restart=True)
        print(f"rollout engine {engine.index}: restart {engine.restarts} failed ({first_line(exc)})", flush=True)
        fleet.counts.time_lost_s += time.monotonic() - began
        return False
    engine.down = False
    fleet.counts.time_lost_s += time.monotonic() - began
    print(
        f"rollout engine {engine.index}: restarted ({engine.restarts} of {fleet.limits.max_restarts_per_engine}) "
        f"in {time.monotonic() - began:.1f}s; it serves once the weights reach it",
        flush=True,
    )
    return True


def died_or_stuck(exc: BaseException) -> bool:
    import ray

    from .rollout_worker import PauseTimeout

    return isinstance(exc, ray.exceptions.RayActorError) or isinstance(getattr(exc, "cause", None), PauseTimeout)
