"""Expert map for MoE rollout (EPLB): from the tokens each expert received in a run's rollouts
(``generate_config.eplb_token_collects: true`` writes ``<run>/expert_load.json``), a placement of physical expert
slots on the rollout engine's expert-parallel devices, hot experts replicated, in vllm-ascend's expert-map format
(``generate_config.expert_map_path``; vllm-ascend's ``additional_config.expert_map_path``).

    # 128 experts over 16 devices with 16 redundant slots (144 = 9 per device), 8 groups on 2 nodes
    python cli/eplb_generate_map.py --load-path logs/<run>/expert_load.json --num-devices 16 \\
        --num-redundant-experts 16 --num-groups 8 --num-nodes 2 --save-path expert_map.json

Prints the imbalance (busiest device's tokens / the mean) of the linear placement without replicas and of the
map, per layer summary and overall; the hierarchical policy keeps each expert group on one node when the nodes
divide the groups, else places over all devices at once (docs/models.md, Expert placement).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Optional, Sequence

from mindspeed_rl.rollout.experts.expert_load import read_expert_load
from mindspeed_rl.rollout.experts.expert_placement import Cluster, expert_map, imbalance, linear_placement, place_layer
from mindspeed_rl.utils.cli import UserError, report_user_errors


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load-path", required=True, help="expert_load.json of a run (generate_config.eplb_token_collects)")
    p.add_argument("--save-path", required=True, help="where the expert map (JSON) goes")
    p.add_argument("--num-devices", type=int, required=True, help="expert-parallel devices of one rollout engine")
    p.add_argument("--num-redundant-experts", type=int, default=0, help="slots beyond one per expert, in all")
    p.add_argument("--num-groups", type=int, default=1, help="expert groups (group-limited routing), kept on a node")
    p.add_argument("--num-nodes", type=int, default=1, help="nodes the devices are on")
    return p.parse_args(argv)


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        loads = read_expert_load(args.load_path)
    except (OSError, ValueError) as exc:
        raise UserError(f"--load-path {args.load_path}: {getattr(exc, 'strerror', None) or exc}") from None
    experts = len(loads[0])
    for flag in ("num_devices", "num_groups", "num_nodes"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')}: must be at least 1")
    if args.num_redundant_experts < 0:
        raise UserError("--num-redundant-experts: must be 0 or more")
    cluster = Cluster(experts + args.num_redundant_experts, args.num_devices, args.num_nodes, args.num_groups)
    if experts % args.num_devices:
        raise UserError(f"--num-devices: {args.num_devices} does not divide the {experts} experts")
    try:
        cluster.check(experts)
    except ValueError as exc:
        raise UserError(f"--num-redundant-experts / --num-devices / --num-groups: {exc}") from None
    placements = [place_layer(load, cluster) for load in loads]
    before = [imbalance(load, linear_placement(experts, args.num_devices)) for load in loads]
    after = [imbalance(load, placement) for load, placement in zip(loads, placements)]
    os.makedirs(os.path.dirname(os.path.abspath(args.save_path)), exist_ok=True)
    with open(args.save_path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(expert_map(placements), fh, indent=1)
    os.replace(args.save_path + ".tmp", args.save_path)
    policy = "hierarchical" if cluster.hierarchical() else "global"
    print(
        f"{len(loads)} MoE layers x {experts} experts -> {cluster.slots} slots on {args.num_devices} devices "
        f"({policy} policy)"
    )
    for name, values in (("linear, no replicas", before), ("expert map", after)):
        print(
            f"imbalance (max / mean device load), {name}: mean over layers {statistics.fmean(values):.3f}, "
            f"worst layer {max(values):.3f}"
        )
    print(f"expert map: {args.save_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
