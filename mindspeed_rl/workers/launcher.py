"""Ray placement: one placement group of actor_resource.num_npus bundles shared by the actor and
critic groups (integrated mode), each group with its own torch.distributed world and master port."""

from __future__ import annotations

import itertools
import os
from typing import Any, Callable, Dict, List, Optional

from ..accelerator import Accelerator
from ..utils.library_logs import ENV_LOG_FILE
from .worker_group import WorkerGroup


def _node_ip_and_port():
    import ray

    from ..utils.dist import free_port

    return ray.util.get_node_ip_address(), free_port("")


def create_placement_group(acc: Accelerator, num_bundles: int, cpus_per_bundle: float, timeout: float = 600.0):
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group([acc.bundle_spec(cpus_per_bundle) for _ in range(num_bundles)], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout)
    if not ready:
        raise RuntimeError(
            f"placement group of {num_bundles} x {acc.bundle_spec(cpus_per_bundle)} could not be "
            f"scheduled in {timeout:.0f}s; cluster resources: {ray.cluster_resources()}"
        )
    return pg


_STARTS = itertools.count()


def spawn_group(
    name: str,
    cls: type,
    acc: Accelerator,
    pg,
    num_ranks: int,
    fraction: float,
    make_kwargs: Callable[[int, str, int], Dict[str, Any]],
    env: Dict[str, str],
    started: Optional[List[WorkerGroup]] = None,
    log_dir: Optional[str] = None,
    first_bundle: int = 0,
) -> WorkerGroup:
    """Start ``num_ranks`` actors of ``cls`` in bundles first_bundle.. first_bundle+num_ranks-1, each taking
    ``fraction`` of a device (appended to ``started`` as soon as they exist). With ``log_dir`` each rank writes
    its library output to ``log_dir/<name>_<rank>.log`` (utils/library_logs.py)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    first = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=first_bundle)
    master_addr, master_port = ray.get(
        ray.remote(num_cpus=0)(_node_ip_and_port).options(scheduling_strategy=first).remote()
    )
    remote_cls = ray.remote(cls)
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
        # ranks of this group on the same host: they share its memory (e.g. the CPU KV-cache budget)
        local = sum(1 for r in range(num_ranks) if nodes.get(first_bundle + r) == nodes.get(first_bundle + rank))
        env_vars = dict(env, LOCAL_WORLD_SIZE=str(max(1, local)))
        if log_dir:
            env_vars[ENV_LOG_FILE] = os.path.join(log_dir, f"{name}_{rank}.log")
        options["runtime_env"] = {"env_vars": env_vars}
        handles.append(remote_cls.options(**options).remote(**make_kwargs(rank, master_addr, master_port)))
    group = WorkerGroup(name, handles)
    if started is not None:
        started.append(group)  # the caller shuts it down even if start-up fails below
    group.load_layouts()
    return group


def bundle_nodes(pg) -> Dict[int, str]:
    """Bundle index -> the node it was placed on."""
    from ray.util.placement_group import placement_group_table

    return {int(k): v for k, v in placement_group_table(pg).get("bundles_to_node_id", {}).items()}


def connect_weight_channel(pg, actor: WorkerGroup, rollout: WorkerGroup) -> None:
    """Open the weight channel of the disaggregated layout: the actor's rank 0 (bundle 0) sends, every
    rollout rank receives; both sides join at once (the channel is a collective)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    first = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
    host, port = ray.get(ray.remote(num_cpus=0)(_node_ip_and_port).options(scheduling_strategy=first).remote())
    size = len(rollout.handles) + 1
    ray.get(
        actor.call_async("open_weight_channel", host, port, size)
        + rollout.call_async("open_weight_channel", host, port, size)
    )
