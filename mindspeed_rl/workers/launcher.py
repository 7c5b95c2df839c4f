"""Ray placement: one placement group of actor_resource.num_npus bundles shared by the actor and
critic groups (integrated mode), each group with its own torch.distributed world and master port."""
from __future__ import annotations

import os
import socket
from typing import Any, Callable, Dict, List, Sequence

from ..accelerator import Accelerator


def _node_ip_and_port():
    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address(), port


class WorkerGroup:
    """The Ray actors of one role, rank order; calls fan out and are gathered."""

    def __init__(self, name: str, handles: List[Any]):
        self.name, self.handles = name, handles
        self.layouts: List[Dict[str, int]] = []

    def call(self, method: str, *args, per_rank: Sequence[tuple] = None, **kwargs) -> List[Any]:
        import ray

        if per_rank is not None:
            refs = [getattr(h, method).remote(*a, **kwargs) for h, a in zip(self.handles, per_rank)]
        else:
            refs = [getattr(h, method).remote(*args, **kwargs) for h in self.handles]
        return ray.get(refs)

    @property
    def dp_size(self) -> int:
        return self.layouts[0]["dp_size"]

    def output_ranks(self) -> Dict[int, int]:
        """dp_rank -> the rank whose results hold that DP group's outputs."""
        return {lay["dp_rank"]: lay["rank"] for lay in self.layouts if lay["output"]}


def bundle_spec(acc: Accelerator, cpus_per_bundle: float) -> Dict[str, float]:
    if acc.kind == "cpu":
        return {"CPU": cpus_per_bundle}
    return {acc.ray_resource: 1.0, "CPU": cpus_per_bundle}


def create_placement_group(acc: Accelerator, num_bundles: int, cpus_per_bundle: float, timeout: float = 600.0):
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group([bundle_spec(acc, cpus_per_bundle) for _ in range(num_bundles)], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout)
    if not ready:
        raise RuntimeError(f"placement group of {num_bundles} x {bundle_spec(acc, cpus_per_bundle)} could not be "
                           f"scheduled in {timeout:.0f}s; cluster resources: {ray.cluster_resources()}")
    return pg


def spawn_group(name: str, cls: type, acc: Accelerator, pg, num_ranks: int, fraction: float,
                make_kwargs: Callable[[int, str, int], Dict[str, Any]], env: Dict[str, str]) -> WorkerGroup:
    """Start ``num_ranks`` actors of ``cls`` in bundles 0..num_ranks-1, each taking ``fraction`` of a device."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    first = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
    master_addr, master_port = ray.get(ray.remote(num_cpus=0)(_node_ip_and_port)
                                       .options(scheduling_strategy=first).remote())
    remote_cls = ray.remote(cls)
    handles = []
    for rank in range(num_ranks):
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=rank)
        options: Dict[str, Any] = {"scheduling_strategy": strategy, "name": f"{name}_{rank}_{os.getpid()}"}
        if acc.kind == "cpu":
            options["num_cpus"] = fraction
        else:
            options["num_cpus"] = 0.01
            options["resources"] = {acc.ray_resource: fraction}
        options["runtime_env"] = {"env_vars": dict(env)}
        handles.append(remote_cls.options(**options).remote(**make_kwargs(rank, master_addr, master_port)))
    group = WorkerGroup(name, handles)
    group.layouts = group.call("layout")
    return group
