"""Expert-parallel load balancing (EPLB) for MoE rollout: from the tokens each expert received, a placement of
physical expert slots on devices in which hot experts are replicated, so that every device gets about the same
share of the tokens.

The hierarchical policy (DeepSeek's EPLB), per MoE layer, for E logical experts in G groups, N nodes, D devices
and R physical slots (R >= E, R a multiple of D, E a multiple of G):

1. groups to nodes: the G groups (their summed loads) packed G/N to a node, heaviest first onto the lightest
   node with room, so that experts of a group (which a token's group-limited routing favours) stay on one node;
2. replicas within a node: its E/N experts share R/N slots; each gets one, then each further slot goes to the
   expert whose load per replica, load_e / r_e, is the largest;
3. slots to devices: the node's R/N slots (each carrying load_e / r_e) packed R/D to a device, heaviest first
   onto the lightest device with room.

When N does not divide G (or the nodes the devices), the whole cluster is one node (the global policy).
The balance of a placement is  imbalance = max_d load_d / mean_d load_d  (1.0: even).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

MAP_FORMAT = "vllm-ascend expert map (moe_layer_count, layer_list[].device_list[].device_expert)"


def balanced_packing(weights: Sequence[float], bins: int) -> List[List[int]]:
    """Items packed into ``bins`` bins of len(weights) / bins items each: heaviest item first, onto the lightest
    bin with room. Returns each bin's item indices."""
    if len(weights) % bins:
        raise ValueError(f"{len(weights)} items do not fill {bins} bins evenly")
    room = len(weights) // bins
    packed: List[List[int]] = [[] for _ in range(bins)]
    totals = [0.0] * bins
    for item in sorted(range(len(weights)), key=lambda i: (-float(weights[i]), i)):
        open_bins = [b for b in range(bins) if len(packed[b]) < room]
        b = min(open_bins, key=lambda k: (totals[k], k))
        packed[b].append(item)
        totals[b] += float(weights[item])
    return packed


def replica_counts(loads: Sequence[float], slots: int) -> List[int]:
    """r_e >= 1 replicas per expert with sum r_e = ``slots``, each extra slot to argmax_e load_e / r_e."""
    if slots < len(loads):
        raise ValueError(f"{slots} slots cannot hold {len(loads)} experts")
    replicas = [1] * len(loads)
    for _ in range(slots - len(loads)):
        e = max(range(len(loads)), key=lambda k: (float(loads[k]) / replicas[k], -k))
        replicas[e] += 1
    return replicas


@dataclass
class Cluster:
    """Where the experts go: ``slots`` physical experts (R) on ``devices`` (D) in ``nodes`` (N); ``groups`` (G)
    expert groups kept together on a node."""

    slots: int
    devices: int
    nodes: int = 1
    groups: int = 1

    def check(self, num_experts: int) -> None:
        if self.slots < num_experts:
            raise ValueError(f"{self.slots} slots are fewer than the {num_experts} experts")
        if self.slots % self.devices:
            raise ValueError(f"{self.slots} slots do not divide evenly over {self.devices} devices")
        if num_experts % self.groups:
            raise ValueError(f"{num_experts} experts do not split into {self.groups} groups")

    def hierarchical(self) -> bool:
        return (
            self.nodes > 1
            and self.groups % self.nodes == 0
            and self.devices % self.nodes == 0
            and self.slots % self.nodes == 0
        )


def place_layer(load: Sequence[float], cluster: Cluster) -> List[List[int]]:
    """One layer's placement: each device's slots as the logical expert ids they hold."""
    experts = len(load)
    cluster.check(experts)
    nodes = cluster.nodes if cluster.hierarchical() else 1
    groups = cluster.groups if nodes > 1 else 1
    per_group = experts // groups
    group_load = [sum(float(x) for x in load[g * per_group : (g + 1) * per_group]) for g in range(groups)]
    devices_per_node, slots_per_node = cluster.devices // nodes, cluster.slots // nodes
    placement: List[List[int]] = []
    for node_groups in balanced_packing(group_load, nodes):
        members = [g * per_group + i for g in sorted(node_groups) for i in range(per_group)]
        replicas = replica_counts([load[e] for e in members], slots_per_node)
        slots = [e for e, r in zip(members, replicas) for _ in range(r)]
        per_slot = [float(load[e]) / r for e, r in zip(members, replicas) for _ in range(r)]
        for device in balanced_packing(per_slot, devices_per_node):
            placement.append(sorted(slots[i] for i in device))
    return placement


def linear_placement(num_experts: int, devices: int) -> List[List[int]]:
    """The engines' default without a map: experts split contiguously over the devices, no replicas."""
    per = num_experts // devices
    return [list(range(d * per, (d + 1) * per)) for d in range(devices)]


def device_loads(load: Sequence[float], placement: List[List[int]]) -> List[float]:
    """Tokens each device serves: an expert's load split evenly over its replicas."""
    replicas = [0] * len(load)
    for slots in placement:
        for e in slots:
            replicas[e] += 1
    unplaced = [e for e, r in enumerate(replicas) if r == 0]
    if unplaced:
        raise ValueError(f"experts with no slot: {unplaced[:5]}")
    return [sum(float(load[e]) / replicas[e] for e in slots) for slots in placement]


def imbalance(load: Sequence[float], placement: List[List[int]]) -> float:
    """max_d load_d / mean_d load_d of a placement (1.0: every device serves the same number of tokens)."""
    per_device = device_loads(load, placement)
    mean = sum(per_device) / len(per_device)
    return max(per_device) / mean if mean > 0 else 1.0


def expert_map(placements: List[List[List[int]]]) -> dict:
    """The placements of every MoE layer in vllm-ascend's expert-map layout (``expert_map_path``)."""
    return {
        "moe_layer_count": len(placements),
        "layer_list": [
            {
                "layer_id": layer,
                "device_count": len(devices),
                "device_list": [{"device_id": d, "device_expert": slots} for d, slots in enumerate(devices)],
            }
            for layer, devices in enumerate(placements)
        ],
    }


def read_expert_map(data: dict, num_layers: int, num_experts: int) -> List[List[List[int]]]:
    """The placements of a map; ValueError naming what does not fit the model (layers, expert ids, an expert
    without a slot, devices with different slot counts)."""
    layers = data.get("layer_list") if isinstance(data, dict) else None
    if not isinstance(layers, list) or data.get("moe_layer_count") != len(layers):
        raise ValueError(f"not a {MAP_FORMAT}")
    if len(layers) != num_layers:
        raise ValueError(f"it places {len(layers)} MoE layers; the model has {num_layers}")
    placements = []
    for layer in layers:
        devices = [list(d.get("device_expert", [])) for d in layer.get("device_list", [])]
        held = {e for slots in devices for e in slots}
        if not devices or any(not isinstance(e, int) or not 0 <= e < num_experts for e in held):
            raise ValueError(f"layer {layer.get('layer_id')}: expert ids must be 0..{num_experts - 1}")
        if len(held) != num_experts:
            raise ValueError(f"layer {layer.get('layer_id')}: {num_experts - len(held)} experts have no slot")
        if len({len(slots) for slots in devices}) != 1:
            raise ValueError(f"layer {layer.get('layer_id')}: devices hold different numbers of slots")
        placements.append(devices)
    return placements
