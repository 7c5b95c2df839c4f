"""Rollout expert parallelism (generate_config.infer_expert_parallel_size, infer_data_parallel_size): the keys' rules
and plan line, each rank's experts, and vLLM's CPU engine at TP 2 x EP 2 and TP 1 x DP 2 x EP 2 against TP alone.

vLLM 0.32's CPU path lacks two pieces expert parallelism needs (compat/vllm_cpu_experts.py): its MoE experts ignore
the expert map (a segfault at the first forward without the patch), and its communicator has no ``all_gatherv`` /
``reduce_scatterv`` for the tokens of an engine's DP ranks (NotImplementedError). The in-flight parity with training
(greedy tokens, router replay's routes, each rank sent only its experts) is tests/test_families.py's."""

import os

import pytest
import torch

from tests import parallel_worker
from tests.helpers import assert_refused

BASE = ["--config-name", "grpo_tiny_cpu", "dry_run=true"]
MOE = ["megatron_training.model=tiny_qwen3_moe", "actor_config.model=tiny_qwen3_moe"]  # 4 experts, top-2
TWO = ["rl_config.actor_resource.num_npus=2"]
EP_KEY = "generate_config.infer_expert_parallel_size"
DP_KEY = "generate_config.infer_data_parallel_size"


@pytest.mark.parametrize(
    "overrides,key,words",
    [
        ([f"{EP_KEY}=2"], EP_KEY, "needs a mixture-of-experts model"),
        (MOE + TWO + [f"{DP_KEY}=2"], DP_KEY, "without expert parallelism"),
        (MOE + TWO + [f"{EP_KEY}=2"], EP_KEY, "is not infer TP 1 x infer DP 1 = 1"),
        (MOE + TWO + [f"{EP_KEY}=2"], EP_KEY, f"{DP_KEY} 2)"),
        (MOE + ["rl_config.actor_resource.num_npus=3", f"{EP_KEY}=3", f"{DP_KEY}=3"], EP_KEY,
         "does not divide the 4 experts"),
        (MOE + [f"{EP_KEY}=2", f"{DP_KEY}=2"], EP_KEY, "is larger than the 1 devices of the rollout engines"),
        (MOE + TWO + [f"{EP_KEY}=2", f"{DP_KEY}=2", "generate_config.backend=fallback"], "generate_config.backend",
         "without expert parallelism"),
        (MOE + ["rl_config.rollout_resource.num_npus=2", f"{EP_KEY}=2", f"{DP_KEY}=2"], DP_KEY,
         "infer_tensor_parallel_size 2"),
    ],
)  # fmt: skip
def test_rollout_expert_parallel_keys_that_do_not_fit_are_refused_before_anything_starts(capsys, overrides, key, words):
    assert_refused(BASE + overrides, key, words, capsys)


def test_the_plan_shows_the_rollout_ep_layout_and_each_ranks_expert_memory(capsys):
    from cli import train_ppo

    args = BASE + MOE + TWO + [f"{EP_KEY}=2", f"{DP_KEY}=2", "generate_config.dtype=float32"]
    assert train_ppo.main(args) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "rollout EP:" in x)
    # tiny_qwen3_moe: 2 MoE layers x 4 experts x 3 matrices of 256 x 128 in fp32 = 3 MiB; half per rank
    assert "EP 2 = infer TP 1 x DP 2 (1 group(s) of 2 ranks): 2 of 4 experts per rank" in line, line
    assert "1.5 MiB of expert weights per rank in float32 (EP 1: 3 MiB)" in line, line


def test_each_rank_keeps_its_own_experts_and_every_tensor_that_is_not_an_experts(monkeypatch):
    from types import SimpleNamespace

    import torch.distributed as dist

    from mindspeed_rl.config_cls import GenerateConfig
    from mindspeed_rl.features.rollout_experts import owned_experts
    from mindspeed_rl.rollout.engines.vllm_engine import kept_experts

    assert [owned_experts(8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    # global rank 5 in groups of 4 ranks (infer TP 2 x DP 2): EP rank 1
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 5)
    gen = GenerateConfig(infer_tensor_parallel_size=2, infer_data_parallel_size=2, infer_expert_parallel_size=4)
    kept = kept_experts(SimpleNamespace(num_experts=8), gen)
    assert [e for e in range(-1, 8) if e in kept] == [-1, 2, 3]
    assert kept_experts(SimpleNamespace(num_experts=8), GenerateConfig()) is None


@pytest.mark.slow
def test_a_cpu_engine_with_experts_split_over_its_ranks_generates_what_tp_alone_does(tmp_path):
    from mindspeed_rl.accelerator.cpu import CpuAccelerator
    from mindspeed_rl.config_cls import ModelConfig
    from mindspeed_rl.config_cls.yaml_guard import load_yaml
    from mindspeed_rl.demo.tiny_hf import build_hf_model

    missing = CpuAccelerator.vllm_expert_parallel_unavailable()
    if missing:
        pytest.skip(missing)
    data = load_yaml("configs/model/tiny_qwen3_moe.yaml")["tiny_qwen3_moe"]
    model = ModelConfig(**data)  # 4 experts, 2 per token: each rank holds 2 with EP 2
    build_hf_model(str(tmp_path / "hf"), model, seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 9, 3, 12, 7)]
    torch.save(prompts, tmp_path / "prompts.pt")
    jobs = [("run_expert_parallel_engine", {"name": "tp2", "tp": 2})]
    jobs.append(("run_expert_parallel_engine", {"name": "tp2_ep2", "tp": 2, "ep": True}))
    parallel_worker.spawn_each(2, jobs, tmp_path)
    # DP 2 (a world of its own: vLLM's groups of another shape): rank 0 generates every prompt, rank 1 none (it
    # still steps its MoE layers with rank 0's)
    parallel_worker.spawn(
        "run_expert_parallel_engine", 2, {"name": "tp1_dp2_ep2", "tp": 1, "dp": 2, "ep": True}, tmp_path
    )
    tp, ep, dp = (torch.load(os.path.join(tmp_path, f"ep_{n}.pt")) for n in ("tp2", "tp2_ep2", "tp1_dp2_ep2"))
    assert ep == tp and all(len(t) == 10 for t in ep), (tp, ep)
    assert dp == tp, (tp, dp)


def test_an_expert_map_must_fit_the_rollout_ep_and_vllm_ascend_gets_it_with_ep(tmp_path, monkeypatch, capsys):
    import json

    from mindspeed_rl.accelerator.npu import NpuAccelerator
    from mindspeed_rl.compat import stack
    from mindspeed_rl.config_cls import GenerateConfig
    from mindspeed_rl.rollout.experts.expert_placement import expert_map, linear_placement

    path = tmp_path / "expert_map.json"
    path.write_text(json.dumps(expert_map([linear_placement(4, 4)] * 2)))  # 4 devices; the rollout's EP is 2
    ep = MOE + TWO + [f"{EP_KEY}=2", f"{DP_KEY}=2", f"generate_config.expert_map_path={path}", "--check"]
    assert_refused(BASE[:2] + ep, "generate_config.expert_map_path", "on 4 devices", capsys)
    monkeypatch.setattr(stack, "installed", lambda name: "0.23.0" if name == "vllm-ascend" else None)
    assert stack.expert_map_unavailable(2) == "" and "infer_expert_parallel_size 1" in stack.expert_map_unavailable(1)
    gen = GenerateConfig(infer_expert_parallel_size=2, infer_data_parallel_size=2, expert_map_path=str(path))
    assert NpuAccelerator.vllm_engine_kwargs(gen)["additional_config"] == {"expert_map_path": str(path)}
    assert "additional_config" not in NpuAccelerator.vllm_engine_kwargs(GenerateConfig(expert_map_path=str(path)))


def test_the_engine_arguments_of_expert_parallelism_exist_in_this_vllm():
    """The compatibility stages run this on the NPU sets' vLLM releases (0.18, 0.23): the arguments the engines get
    for rollout EP are engine arguments there too (vllm-ascend takes the same LLM(...) arguments)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    from mindspeed_rl.config_cls import GenerateConfig
    from mindspeed_rl.rollout.engines.vllm_engine import engine_kwargs

    kwargs = engine_kwargs(GenerateConfig(infer_expert_parallel_size=2, infer_data_parallel_size=2), seed=1, kind="cpu")
    assert kwargs["enable_expert_parallel"] is True and kwargs["data_parallel_size"] == 2
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert {"enable_expert_parallel", "data_parallel_size", "additional_config"} <= fields
