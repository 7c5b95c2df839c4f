"""EPLB: the placement policy on hand-built loads, the expert-load counts from captured routes (and their
resume state), cli/eplb_generate_map.py, and the keys' refusals. The counts of a real run are checked in
tests/test_families.py's Qwen3-MoE run."""

import json
import random

import pytest
import torch

from cli import eplb_generate_map
from mindspeed_rl.rollout.experts.expert_load import ExpertLoad, read_expert_load
from mindspeed_rl.rollout.experts.expert_placement import (
    Cluster,
    balanced_packing,
    expert_map,
    imbalance,
    linear_placement,
    place_layer,
    read_expert_map,
    replica_counts,
)
from tests.helpers import assert_refused


def test_replicas_go_to_the_highest_load_per_replica_and_packing_balances_the_bins():
    assert replica_counts([10, 1, 1, 1], 6) == [3, 1, 1, 1]  # 10 -> 5 -> 3.3, still above the others
    assert replica_counts([4, 4, 1], 5) == [2, 2, 1]
    bins = balanced_packing([5, 4, 3, 3, 2, 1], 2)
    assert sorted(len(b) for b in bins) == [3, 3]
    assert sorted(sum([5, 4, 3, 3, 2, 1][i] for i in b) for b in bins) == [9, 9]
    with pytest.raises(ValueError, match="do not fill 4 bins"):
        balanced_packing([1, 2, 3], 4)


def test_a_hot_expert_is_replicated_until_the_devices_are_even():
    load = [70.0] + [10.0] * 7  # expert 0 takes half the tokens
    cluster = Cluster(slots=12, devices=4)
    placement = place_layer(load, cluster)
    assert [len(slots) for slots in placement] == [3, 3, 3, 3]
    assert {e for slots in placement for e in slots} == set(range(8))
    assert sum(slots.count(0) for slots in placement) == 5  # 70 / 5 = 14, the others 10
    before = imbalance(load, linear_placement(8, 4))
    assert before == pytest.approx(80 / 35)  # device 0 holds experts 0 and 1
    assert imbalance(load, placement) < 1.15


def test_the_hierarchical_policy_keeps_each_group_on_one_node():
    gen = random.Random(0)
    load = [gen.uniform(1, 100) for _ in range(16)]
    cluster = Cluster(slots=20, devices=4, nodes=2, groups=4)  # 4 experts per group, 2 devices per node
    assert cluster.hierarchical()
    placement = place_layer(load, cluster)
    for group in range(4):
        members = set(range(group * 4, group * 4 + 4))
        nodes = {d // 2 for d, slots in enumerate(placement) if members & set(slots)}
        assert len(nodes) == 1, (group, placement)
    assert not Cluster(slots=20, devices=4, nodes=3, groups=4).hierarchical()  # falls back to the global policy


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_map_never_balances_worse_than_the_linear_placement(seed):
    gen = random.Random(seed)
    for experts, devices, redundant, nodes, groups in [(16, 4, 4, 1, 1), (32, 8, 8, 2, 4), (64, 8, 0, 2, 8)]:
        load = [gen.paretovariate(1.2) * 100 for _ in range(experts)]  # a few hot experts
        placement = place_layer(load, Cluster(experts + redundant, devices, nodes, groups))
        assert {len(slots) for slots in placement} == {(experts + redundant) // devices}
        assert imbalance(load, placement) <= imbalance(load, linear_placement(experts, devices)) + 1e-9
        assert read_expert_map(expert_map([placement]), 1, experts) == [placement]


def test_a_map_that_does_not_fit_the_model_is_named():
    good = expert_map([linear_placement(8, 2)])
    with pytest.raises(ValueError, match="places 1 MoE layers; the model has 2"):
        read_expert_map(good, 2, 8)
    with pytest.raises(ValueError, match="expert ids must be 0..3"):
        read_expert_map(good, 1, 4)
    holes = expert_map([[[0, 1, 2], [0, 1, 2]]])
    with pytest.raises(ValueError, match="1 experts have no slot"):
        read_expert_map(holes, 1, 4)
    with pytest.raises(ValueError, match="not a vllm-ascend expert map"):
        read_expert_map({"layers": []}, 1, 4)


def test_counts_come_from_the_captured_routes_and_resume_from_the_checkpoint(tmp_path):
    routes = torch.full((2, 3, 2, 2), -1, dtype=torch.int16)  # [B, S, L, K]; -1: no route
    routes[0, 0] = torch.tensor([[0, 1], [2, 3]])
    routes[0, 1] = torch.tensor([[0, 2], [0, 1]])
    routes[1, 0] = torch.tensor([[3, 0], [3, 2]])
    counts = ExpertLoad(2, 4, str(tmp_path / "expert_load.json"), "tiny", 2)
    counts.add(routes)
    assert counts.counts.tolist() == [[3, 1, 1, 1], [1, 1, 2, 2]] and counts.tokens == 3
    counts.save()
    assert read_expert_load(counts.path) == [[3.0, 1.0, 1.0, 1.0], [1.0, 1.0, 2.0, 2.0]]
    state = counts.state_dict()
    counts.add(routes)  # an iteration after the checkpoint: a resume does not count it
    resumed = ExpertLoad(2, 4, counts.path)
    resumed.load_state_dict(state)
    assert resumed.counts.tolist() == [[3, 1, 1, 1], [1, 1, 2, 2]] and resumed.iterations == 1
    with pytest.raises(ValueError, match=r"expected \[B, S, 2, K\]"):
        counts.add(routes[:, :, :1])


def test_the_cli_writes_a_map_and_prints_the_imbalance_before_and_after(tmp_path, capsys):
    counts = ExpertLoad(2, 8, str(tmp_path / "expert_load.json"))
    counts.counts = torch.tensor([[700, 100, 100, 100, 100, 100, 100, 100], [100] * 8])
    counts.save()
    out = tmp_path / "maps" / "expert_map.json"
    args = ["--load-path", counts.path, "--save-path", str(out), "--num-devices", "4", "--num-redundant-experts", "4"]
    assert eplb_generate_map.main(args) == 0
    printed = capsys.readouterr().out
    assert "2 MoE layers x 8 experts -> 12 slots on 4 devices (global policy)" in printed
    assert "linear, no replicas: mean over layers 1.643, worst layer 2.286" in printed
    placements = read_expert_map(json.load(open(out)), 2, 8)
    assert sum(slots.count(0) for slots in placements[0]) == 5
    for bad, text in [
        (["--num-devices", "3"], "--num-devices: 3 does not divide the 8 experts"),
        (["--num-groups", "3"], "do not split into 3 groups"),
        (["--load-path", str(out)], "not an expert-load file"),
        (["--load-path", str(tmp_path / "none.json")], "No such file"),
    ]:
        assert eplb_generate_map.main(args + bad) == 2
        assert text in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, shown", [("NaN", "nan"), ("Infinity", "inf"), ("1e400", "inf"), ("-3", "-3"), ("true", "True")]
)
def test_the_cli_refuses_a_count_that_is_not_a_finite_number_naming_the_file_layer_and_expert(
    tmp_path, capsys, value, shown
):
    """NaN and Infinity are valid to Python's json reader; before the fix a NaN count made a map."""
    path = tmp_path / "expert_load.json"
    rows = "[[5, 1, 1, 1], [2, 2, %s, 2]]" % value
    path.write_text('{"format": "mindspeed_rl.expert_load/1", "load": %s}' % rows)
    out = tmp_path / "expert_map.json"
    args = ["--load-path", str(path), "--save-path", str(out), "--num-devices", "2"]
    assert eplb_generate_map.main(args) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"error: --load-path {path}: load[1][2] (MoE layer 1, expert 2) is {shown}, not a token count"]
    assert not out.exists()


def test_the_eplb_keys_are_refused_where_they_cannot_work(tmp_path, capsys):
    base = ["--config-name", "grpo_tiny_cpu", "dry_run=true"]
    moe = ["megatron_training.model=tiny_qwen3_moe", "actor_config.model=tiny_qwen3_moe"]
    collect = ["generate_config.eplb_token_collects=true"]
    assert_refused(base + collect, "generate_config.eplb_token_collects", "tiny_qwen25 has no experts", capsys)
    eager = ["generate_config.enforce_eager=false"]
    assert_refused(base + moe + collect + eager, "generate_config.enforce_eager", "eplb_token_collects", capsys)
    path = tmp_path / "expert_map.json"
    path.write_text(json.dumps(expert_map([linear_placement(4, 2)])))  # one layer; tiny_qwen3_moe has two
    map_key = [f"generate_config.expert_map_path={path}"]
    assert_refused(base[:2] + moe + map_key + ["--check"], "generate_config.expert_map_path", "places 1", capsys)
    path.write_text(json.dumps(expert_map([linear_placement(4, 2)] * 2)))
    assert_refused(base[:2] + moe + map_key + ["--check"], "generate_config.expert_map_path", "static", capsys)


def test_with_vllm_ascend_the_refusal_names_the_engines_expert_parallelism(monkeypatch):
    from mindspeed_rl.compat import stack

    monkeypatch.setattr(stack, "installed", lambda name: "0.13.0" if name == "vllm-ascend" else None)
    reason = stack.expert_map_unavailable(1)
    assert "additional_config.expert_map_path" in reason and "infer_expert_parallel_size 1" in reason


def test_the_moe_recipe_and_its_eplb_variant_plan(capsys):
    from cli import train_ppo

    assert train_ppo.main(["--config-name", "grpo_qwen3_30b_a3b_eplb_A3", "dry_run=true"]) == 0
    plan = capsys.readouterr().out
    assert "128 experts over EP 4" in plan and "eplb      : tokens per expert and MoE layer counted into" in plan
    assert train_ppo.main(["--config-name", "grpo_qwen3_30b_a3b_A3", "dry_run=true"]) == 0
    assert "eplb" not in capsys.readouterr().out
