"""Ray placement: one placement group of actor_resource.num_npus bundles shared by the actor and
critic groups (integrated mode), each group with its own torch.distributed world and master port."""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Set

from ..accelerator import Accelerator
from ..protocol import WorldSpec
from ..utils.cli import UserError
from ..utils.library_logs import ENV_LOG_FILE
from .worker_group import WorkerGroup


def _node_ip_and_ports(count: int = 1, avoid: Iterable[int] = ()):
    """This node's IP and ``count`` ports free on it, none of them in ``avoid`` (ports handed out already but
    not bound yet)."""
    import ray

    from ..utils.dist import free_port

    ports: List[int] = []
    while len(ports) < count:
        port = free_port("")
        if port not in ports and port not in avoid:
            ports.append(port)
    return ray.util.get_node_ip_address(), ports


def bundle_ip_and_ports(pg, bundle: int, count: int = 1, avoid: Iterable[int] = ()):
    """``_node_ip_and_ports`` on the node that holds ``bundle``: looked up here when that node is the driver's
    own, else by a task placed in the bundle (a worker process to start: ~2 s)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if bundle_nodes(pg).get(bundle) == ray.get_runtime_context().get_node_id():
        return _node_ip_and_ports(count, avoid)
    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
    return ray.get(
        ray.remote(num_cpus=0)(_node_ip_and_ports).options(scheduling_strategy=strategy).remote(count, list(avoid))
    )


def describe_resources(resources: Dict[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(resources.items()))


def bundles_that_fit(bundle: Dict[str, float], nodes: Iterable[Dict[str, float]]) -> int:
    """How many copies of ``bundle`` the nodes (each node's total resources) hold at once, each copy on one
    node. The copies are alike, so this is exact: a larger count can never be placed, however long one waits."""
    fit = 0
    for node in nodes:
        # Ray counts resources in 1e-4 units: round before taking the floor (0.7 / 0.1 is 6.999...)
        fit += min(math.floor(round(node.get(name, 0.0) / amount, 4)) for name, amount in bundle.items() if amount > 0)
    return fit


def placement_shortfall(
    asked_by: str, bundle: Dict[str, float], num_bundles: int, nodes: List[Dict[str, float]]
) -> Optional[str]:
    """The reason ``num_bundles`` x ``bundle`` can never be placed on ``nodes`` (each node's total resources,
    as ``ray.nodes()`` gives them); None when they fit the cluster (free or not)."""
    fit = bundles_that_fit(bundle, nodes)
    if num_bundles <= fit:
        return None
    asked = {name: amount * num_bundles for name, amount in bundle.items()}
    there = {name: sum(node.get(name, 0.0) for node in nodes) for name in bundle}
    return (
        f"{asked_by}: the run needs {num_bundles} placement-group bundle(s) of {describe_resources(bundle)} "
        f"({describe_resources(asked)} in all), but the Ray cluster has {describe_resources(there)} on "
        f"{len(nodes)} node(s): room for {fit} such bundle(s). Ask for fewer, or give Ray more devices "
        "(NPUS_PER_NODE, NNODES in docs/operations.md)"
    )


def create_placement_group(
    acc: Accelerator,
    num_bundles: int,
    cpus_per_bundle: float,
    asked_by: str,
    timeout: float = 600.0,
    report_every: float = 30.0,
):
    """A PACK placement group of ``num_bundles`` device slots. A request the cluster can never hold is refused
    at once (UserError naming ``asked_by``, the config keys that sized it); one that fits but is not free yet
    waits up to ``timeout`` seconds, saying every ``report_every`` seconds what it waits for."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = acc.bundle_spec(cpus_per_bundle)
    reason = placement_shortfall(asked_by, bundle, num_bundles, [n["Resources"] for n in ray.nodes() if n["Alive"]])
    if reason:
        raise UserError(reason)
    pg = placement_group([dict(bundle) for _ in range(num_bundles)], strategy="PACK")
    ready, start = pg.ready(), time.monotonic()
    try:
        while not ray.wait([ready], timeout=max(0.0, min(report_every, timeout - (time.monotonic() - start))))[0]:
            waited = time.monotonic() - start
            free = {name: ray.available_resources().get(name, 0.0) for name in bundle}
            if waited >= timeout:
                raise UserError(
                    f"{asked_by}: {num_bundles} placement-group bundle(s) of {describe_resources(bundle)} fit the "
                    f"Ray cluster but were not free within {timeout:.0f}s (free now: {describe_resources(free)}); "
                    "other jobs hold the rest: stop them or rerun later"
                )
            print(
                f"waiting for Ray to place {num_bundles} bundle(s) of {describe_resources(bundle)}: the cluster has "
                f"room for them, but other jobs hold part of it (free now: {describe_resources(free)}; "
                f"{waited:.0f}s of {timeout:.0f}s)",
                flush=True,
            )
    except BaseException:
        remove_placement_group(pg)
        raise
    return pg


_STARTS = itertools.count()


@dataclass
class RunFrame:
    """What a launch starts worker groups on: the accelerator, the workers' environment, the folder of the
    libraries' logs (None: the console), the placement group, the groups started so far (``workers``, for the
    clean-up) and what to close before they stop (``on_exit``)."""

    acc: Accelerator
    env: Dict[str, str]
    log_dir: Optional[str]
    pg: Any = None
    workers: List[WorkerGroup] = field(default_factory=list)
    closers: List[Callable[[], None]] = field(default_factory=list)

    def on_exit(self, close: Callable[[], None]) -> None:
        self.closers.append(close)


def spawn_group(
    frame: RunFrame,
    name: str,
    cls: type,
    num_ranks: int,
    fraction: float,
    threads: int,
    kwargs: Dict[str, Any],
    first_bundle: int = 0,
    wait: bool = True,
    taken_ports: Optional[Set[int]] = None,
    concurrency: int = 1,
) -> WorkerGroup:
    """Start ``num_ranks`` actors of ``cls`` in bundles first_bundle.. first_bundle+num_ranks-1 of ``frame.pg``,
        each taking ``fraction`` of a device and built with its ``WorldSpec`` (``threads`` CPU threads) and
        ``kwargs`` (appended to ``frame.workers`` as soon as they exist). With ``frame.log_dir`` each rank writes its
        library output to ``log_dir/<name>_<rank>.log`` (utils/library_logs.py). ``wait``: return once every rank is
        built (else ``wait_until_built`` later, the group starting meanwhile); ``taken_ports``: master ports of groups
        still starting, not to be handed out again (the group's own is added); ``concurrency`` > 1: a threaded actor
    running that many calls at once."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    acc, pg, log_dir = frame.acc, frame.pg, frame.log_dir
    master_addr, (master_port,) = bundle_ip_and_ports(pg, first_bundle, avoid=taken_ports or ())
    if taken_ports is not None:
        taken_ports.add(master_port)
    groups = getattr(cls, "CONCURRENCY_GROUPS", None)  # methods that answer while others run (health probes)
    remote_cls = ray.remote(concurrency_groups=groups)(cls) if groups else ray.remote(cls)
    nodes = bundle_nodes(pg)
    handles = []
    for rank in range(num_ranks):
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=first_bundle + rank
        )
        # unique per start: a driver may run several trainings, and a stopped actor's name is freed lazily
        options: Dict[str, Any] = {
            "scheduling_strategy": strategy,
            "name": f"{name}_{rank}_{os.getpid()}{next(_STARTS):04d}",
            **acc.actor_options(fraction),
        }
        if concurrency > 1:
            options["max_concurrency"] = concurrency

        # ranks of this group on the same host: they share its memory (e.g. the CPU KV-cache budget)
        local = sum(1 for r in range(num_ranks) if nodes.get(first_bundle + r) == nodes.get(first_bundle + rank))
        env_vars = dict(frame.env, LOCAL_WORLD_SIZE=str(max(1, local)))
        if log_dir:
            env_vars[ENV_LOG_FILE] = os.path.join(log_dir, f"{name}_{rank}.log")
        options["runtime_env"] = {"env_vars": env_vars}
        world = WorldSpec(rank, num_ranks, master_addr, master_port, threads)
        handles.append(remote_cls.options(**options).remote(world, **kwargs))
    group = WorkerGroup(name, handles)
    frame.workers.append(group)  # the caller shuts it down even if start-up fails below
    if wait:
        group.load_layouts()
    return group


def wait_until_built(groups: Iterable[WorkerGroup], timeout_s: Optional[float] = None, key: str = "") -> None:
    """Every rank of ``groups`` constructed (their layouts read); the groups were started side by side. A group
    not built within ``timeout_s`` (the setting ``key``) is named (TimeoutError)."""
    for group in groups:
        if not group.layouts:
            group.load_layouts(timeout_s, key)


def bundle_nodes(pg) -> Dict[int, str]:
    """Bundle index -> the node it was placed on."""
    from ray.util.placement_group import placement_group_table

    return {int(k): v for k, v in placement_group_table(pg).get("bundles_to_node_id", {}).items()}


def weight_transfer_of(groups: List[WorkerGroup]) -> str:
    """How the rollout workers take weights (``channel`` or ``vllm_native``; they must agree), printing why where
    vLLM's transfer was asked for but is missing."""
    import ray

    answers = set(ray.get([ref for group in groups for ref in group.call_async("weight_transfer")]))
    if len(answers) != 1:
        raise RuntimeError(f"rollout workers disagree on how they take weights: {sorted(answers, key=str)}")
    ((mode, reason),) = answers
    if reason:
        print(f"generate_config.weight_transfer: vllm_native unavailable ({reason}); weights go over the channel")
    return mode


def weight_channel_opener(pg, mode: str, sync_timeout_s: float, setup_timeout_s: float, engines: int):
    """``connect(actor, engine)``: open the weight channel between the actor's rank 0 (bundle 0), which sends, and
    the ranks of one rollout engine, which receive (a collective: both sides join at once), within
    ``setup_timeout_s``. A send waits ``sync_timeout_s`` for an engine; a receiver waits out the sender's turns with
    every other engine."""
    import ray

    from ..rollout.service import EngineFailed
    from .engine_health import settled

    def connect(actor: WorkerGroup, engine) -> None:
        host, ports = bundle_ip_and_ports(pg, 0, 1 + (mode == "vllm_native"))
        size = len(engine.group.handles) + 1
        native_port = ports[1] if mode == "vllm_native" else None
        receive_s = sync_timeout_s * engines + 60.0
        refs = actor.call_async(
            "open_weight_channel", host, ports[0], size, native_port, engine.index, sync_timeout_s
        ) + engine.group.call_async("open_weight_channel", host, ports[0], size, native_port, receive_s)
        if not settled(refs, setup_timeout_s).issuperset(refs):
            raise EngineFailed(
                f"rollout engine {engine.index}: its weight channel did not open within "
                f"rl_config.rollout_fault_tolerance.setup_timeout_s = {setup_timeout_s:g} s"
            )
        ray.get(refs)

    return connect
