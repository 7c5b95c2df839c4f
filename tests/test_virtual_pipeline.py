"""The interleaved pipeline (VPP): which layers each rank holds, the keys' refusals, checkpoints resharded into and
out of it (bit-exact), a checkpoint of another layout refused with its reshard command, and a PPO run at PP 2 x VPP 2
resumed exactly. The engine's outputs, losses and updated weights at PP 2 x VPP 2 equal TP 1's in
tests/test_parallel_equivalence.py; the hf -> mcore -> hf round trip with VPP is in tests/test_checkpoint.py."""

import os

import pytest
import torch

from cli import convert_ckpt
from mindspeed_rl.checkpoint import megatron_layout as ml
from mindspeed_rl.checkpoint.megatron_reader import iter_mg_stages
from mindspeed_rl.config_cls.megatron_config import pipeline_layers
from mindspeed_rl.demo.tiny_hf import build_hf_model
from mindspeed_rl.features import load_ppo_config
from tests.helpers import assert_refused, tiny_model_config, tiny_role

VPP = [
    "rl_config.actor_resource.num_npus=2",
    "actor_config.pipeline_model_parallel_size=2",
    "+actor_config.virtual_pipeline_model_parallel_size=2",
]


def test_each_rank_holds_one_block_per_model_chunk():
    assert pipeline_layers(8, 2, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert pipeline_layers(8, 2, 4) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert pipeline_layers(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert pipeline_layers(4, 2, 1, [1, 3]) == [[0], [1, 2, 3]]
    role = tiny_role(pp=2, model=tiny_model_config(num_layers=8), num_layers_per_virtual_pipeline_stage=1)
    assert role.megatron.virtual_stages(8) == 4 and role.megatron.stage_layers(8) == pipeline_layers(8, 2, 4)


@pytest.mark.parametrize(
    "overrides, key, text",
    [
        (["+actor_config.virtual_pipeline_model_parallel_size=2"], "virtual_pipeline_model_parallel_size", "PP 1"),
        (VPP[:2] + ["+actor_config.virtual_pipeline_model_parallel_size=3"], "virtual_pipeline", "does not divide"),
        (VPP + ["+actor_config.num_layers_per_virtual_pipeline_stage=1"], "num_layers_per_virtual", "give one"),
        (VPP[:2] + ["+actor_config.num_layers_per_virtual_pipeline_stage=3"], "num_layers_per_virtual", "divide"),
        (VPP + ["actor_config.num_layer_list='1,3'"], "virtual_pipeline_model_parallel_size", "num_layer_list"),
        (VPP + ["+actor_config.lora_r=8"], "virtual_pipeline_model_parallel_size", "lora_r"),
        (VPP + ["actor_config.micro_batch_size=64"], "actor_config.micro_batch_size", "multiple of PP 2"),
    ],
)
def test_a_vpp_layout_that_cannot_run_exits_2_naming_the_key(overrides, key, text, capsys):
    assert_refused(["--config-name", "ppo_tiny_cpu", "dry_run=true", *overrides], key, text, capsys)


def reshard(load, save, *extra):
    argv = ["--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", load, "--save-dir", save]
    return convert_ckpt.main(argv + ["--target-tensor-parallel-size", "1", *extra])


def full_weights(folder):
    return {k: v for _, stage in iter_mg_stages(folder) for k, v in stage.items()}


def test_checkpoints_reshard_into_and_out_of_vpp_bit_exactly(tmp_path, capsys):
    hf = str(tmp_path / "hf")
    build_hf_model(hf, tiny_model_config(num_layers=4))
    plain = str(tmp_path / "pp2")
    argv = ["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", hf, "--save-dir", plain]
    assert convert_ckpt.main(argv + ["--target-pipeline-parallel-size", "2", "--add-qkv-bias"]) == 0
    vpp = str(tmp_path / "vpp")
    interleaved = ["--target-pipeline-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]
    assert reshard(plain, vpp, *interleaved) == 0
    rank0 = ml.load_rank(vpp, 0, 0, expected=(1, 2))
    assert rank0["config"]["stage_layers"] == [[0, 2], [1, 3]]
    # rank 0's own layer 1 is global layer 2 (the plain layout's rank 1, layer 0)
    want = ml.load_rank(plain, 0, 1, expected=(1, 2))["model"]["decoder.layers.0.mlp.linear_fc2.weight"]
    assert torch.equal(rank0["model"]["decoder.layers.1.mlp.linear_fc2.weight"], want)
    back = str(tmp_path / "pp1")
    assert reshard(vpp, back, "--target-pipeline-parallel-size", "1") == 0
    a, b = full_weights(plain), full_weights(back)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    bad = ["--target-pipeline-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"]
    assert reshard(plain, str(tmp_path / "bad"), *bad) == 2
    assert "--num-layers-per-virtual-pipeline-stage 3: needs PP > 1 and PP x it to divide" in capsys.readouterr().err


def test_a_checkpoint_of_another_layer_layout_is_refused_with_its_reshard_command(tmp_path):
    from mindspeed_rl.trainer.startup.preflight import check_role
    from mindspeed_rl.utils.cli import UserError

    hf, plain = str(tmp_path / "hf"), str(tmp_path / "pp2")
    cfg = load_ppo_config("ppo_tiny_cpu", VPP + [f"actor_config.load={plain}"])
    build_hf_model(hf, cfg.actor.model)  # the run's model (tiny_qwen25: 4 layers)
    argv = ["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", hf, "--save-dir", plain]
    assert convert_ckpt.main(argv + ["--target-pipeline-parallel-size", "2", "--add-qkv-bias"]) == 0
    with pytest.raises(UserError, match=r"stores the pipeline ranks' layers as \[\[0, 1\], \[2, 3\]\]") as refused:
        check_role(cfg.actor)
    command = str(refused.value).split("Reshard it: python cli/convert_ckpt.py ", 1)[1].split()
    assert "--num-layers-per-virtual-pipeline-stage" in command and convert_ckpt.main(command) == 0
    check_role(load_ppo_config("ppo_tiny_cpu", VPP + [f"actor_config.load={plain}_vpp2"]).actor)


@pytest.mark.slow
def test_a_ppo_run_at_pp2_vpp2_trains_reshards_and_resumes_exactly(tmp_path, demo_assets):
    """Actor at PP 2 x VPP 2 (rank 0 holds layers 0 and 2): vLLM's log-probs after resharding match the
    engine's, and iteration 2 resumed from iteration 1's checkpoint equals the straight run's."""
    from mindspeed_rl.trainer.launch import train
    from tests.test_resume import COMPARED, cfg_for, weights

    root = str(tmp_path)
    extra = dict(override.split("=", 1) for override in VPP)
    straight = train(cfg_for(root, demo_assets, "straight", 2, **{"megatron_training.save_interval": 1, **extra}))
    assert [m["iteration"] for m in straight] == [1, 2]
    for m in straight:  # the rollout engine (bf16) holds the interleaved ranks' layers in their places: PP 2's
        # level (0.008-0.009 measured; a layer out of place moves log-probs by far more)
        assert m["rollout/logprob_diff_max"] < 0.03 and m["rollout/logprob_diff_mean"] < 0.005, m
    assert ml.load_rank(f"{root}/straight/actor", 0, 0, expected=(1, 2))["config"]["stage_layers"] == [[0, 2], [1, 3]]
    os.makedirs(f"{root}/split")
    from tests.helpers import checkpoints_up_to

    for role in ("actor", "critic"):
        checkpoints_up_to(f"{root}/straight/{role}", f"{root}/split/{role}", 1)
    resume = {f"{r}_config.{k}": v for r in ("actor", "critic") for k, v in (("finetune", "false"),)}
    resume.update({f"{r}_config.load": f"{root}/split/{r}" for r in ("actor", "critic")})
    second = train(cfg_for(root, demo_assets, "split", 2, **resume, **extra))
    assert [m["iteration"] for m in second] == [2]
    for key in COMPARED:
        assert straight[1][key] == pytest.approx(second[0][key], abs=1e-6), key
    for pp_rank in (0, 1):
        wa = ml.load_rank(f"{root}/straight/actor", 0, pp_rank, expected=(1, 2))["model"]
        wb = ml.load_rank(f"{root}/split/actor", 0, pp_rank, expected=(1, 2))["model"]
        assert max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa) <= 1e-6
    assert weights(f"{root}/split/critic")
