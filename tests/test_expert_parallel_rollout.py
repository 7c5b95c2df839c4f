"""Rollout expert parallelism on CPU (issue 81's first step): vLLM 0.32's CPU MoE experts ignore the expert map, so
an engine with ``enable_expert_parallel`` indexed past its rank's experts and crashed at its first forward
(compat/vllm.py ``cpu_moe_experts_follow_the_expert_map``). With the map applied, TP 2 x EP 2 generates what TP 2
does, token for token in fp32."""

import os

import pytest
import torch

from tests import parallel_worker


@pytest.mark.slow
def test_a_cpu_engine_with_experts_split_over_its_ranks_generates_what_tp_alone_does(tmp_path):
    from mindspeed_rl.config_cls import ModelConfig
    from mindspeed_rl.config_cls.yaml_guard import load_yaml
    from mindspeed_rl.demo.tiny_hf import build_hf_model

    data = load_yaml("configs/model/tiny_qwen3_moe.yaml")["tiny_qwen3_moe"]
    model = ModelConfig(**data)  # 4 experts, 2 per token: each rank holds 2 with EP 2
    build_hf_model(str(tmp_path / "hf"), model, seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 9, 3, 12)]
    torch.save(prompts, tmp_path / "prompts.pt")
    jobs = [("run_expert_parallel_engine", {"name": "tp2", "ep": False})]
    jobs.append(("run_expert_parallel_engine", {"name": "tp2_ep2", "ep": True}))
    parallel_worker.spawn_each(2, jobs, tmp_path)
    tp, ep = (torch.load(os.path.join(tmp_path, f"ep_{n}.pt")) for n in ("tp2", "tp2_ep2"))
    assert ep == tp and all(len(t) == 10 for t in ep), (tp, ep)
