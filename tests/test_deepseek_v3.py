"""DeepSeek-V3 at unit level: what is refused and how (exit 2 naming the file or key, nothing written), the
multi-token-prediction tensors read past and counted, the per-rank sizes of the plan, the 671B recipes' dry runs.
Parity, round trips and the GRPO run with vLLM are in tests/test_families.py."""

import json
import logging
import os

import pytest
from safetensors.torch import load_file, save_file

from cli import convert_ckpt
from mindspeed_rl.checkpoint.convert import hf_to_mg
from mindspeed_rl.demo.tiny_hf import build_hf_model
from mindspeed_rl.families import FamilyError, get_family
from mindspeed_rl.families.parameters import parameter_count, parameters_per_rank
from tests.helpers import tiny_family_model as tiny


def _hf(tmp_path, name="hf"):
    folder = tmp_path / name
    build_hf_model(str(folder), tiny("deepseek_v3"), seed=2)
    return folder


def _convert(load, save, *extra):
    return convert_ckpt.main(
        ["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", str(load), "--save-dir", str(save)]
        + list(extra)
    )


def _edit_tensors(folder, edit):
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "missing",
    ["model.layers.1.self_attn.kv_b_proj.weight", "model.layers.2.mlp.experts.5.up_proj.weight"],
)
def test_a_checkpoint_missing_an_mla_or_expert_tensor_exits_2_naming_it(tmp_path, capsys, missing):
    folder = _hf(tmp_path)
    _edit_tensors(folder, lambda t: t.pop(missing))
    assert _convert(folder, tmp_path / "mg") == 2
    err = capsys.readouterr().err
    assert missing in err and str(folder) in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "mg" / "latest_checkpointed_iteration.txt")


def test_an_unknown_family_and_an_expert_count_ep_does_not_divide_exit_2(tmp_path, capsys):
    folder = _hf(tmp_path)
    assert _convert(folder, tmp_path / "ep3", "--target-expert-parallel-size", "3") == 2
    assert "does not divide the 8 experts" in capsys.readouterr().err
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt_oss", "architectures": ["GptOss"]}))
    assert _convert(folder, tmp_path / "unknown") == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "'gpt_oss'" in err and "deepseek_v3" in err and "Traceback" not in err


def test_multi_token_prediction_tensors_are_counted_not_converted(tmp_path, caplog):
    folder = _hf(tmp_path)
    mtp = ["model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight"]

    def add(tensors):
        for name in mtp:
            tensors[name] = tensors["model.norm.weight"].clone()

    _edit_tensors(folder, add)
    with caplog.at_level(logging.WARNING):
        hf_to_mg(str(folder), str(tmp_path / "mg"))
    assert "2 tensors of multi-token-prediction layers not converted" in caplog.text
    assert get_family("deepseek_v3").untrained_hf_names(mtp + ["model.layers.2.mlp.gate.weight"], tiny("deepseek_v3"))
    assert get_family("deepseek_v3").untrained_hf_names(mtp, tiny("deepseek_v3")) == mtp


def test_routing_and_rope_the_engine_cannot_match_are_refused_naming_them():
    hf = get_family("deepseek_v3").hf_config(tiny("deepseek_v3"), 0, 0)
    family = get_family("deepseek_v3")
    assert family.model_config_from_hf(hf).moe_router_num_groups == 2
    cases = [
        ({"rope_interleave": False}, "rope_interleave"),
        ({"num_experts_per_tok": 4}, "topk_group"),  # 4 from 1 group: megatron would score groups by 4 experts
        ({"scoring_func": "softmax"}, "sigmoid"),
        ({"norm_topk_prob": False}, "norm_topk_prob"),
    ]
    for change, named in cases:
        with pytest.raises(FamilyError, match=named):
            family.model_config_from_hf({**hf, **change})


@pytest.mark.parametrize(
    "override,key",
    [
        (["actor_config.lora_r=8", "actor_config.lora_alpha=16"], "actor_config.lora_r"),
        (["actor_config.context_parallel_size=2", "rl_config.actor_resource.num_npus=2"], "context_parallel_size"),
    ],
)
def test_lora_and_context_parallelism_with_mla_exit_2_naming_the_key(override, key, capsys):
    from cli import train_ppo

    models = ["megatron_training.model=tiny_deepseek_v3", "actor_config.model=tiny_deepseek_v3"]
    assert train_ppo.main(["--config-name", "grpo_tiny_cpu", "dry_run=true"] + models + override) == 2
    err = capsys.readouterr().err
    assert key in err and "multi-latent attention" in err and "Traceback" not in err


def test_a_rank_holds_its_share_and_the_whole_model_on_one_rank_is_the_parameter_count():
    model = tiny("deepseek_v3")
    assert sum(parameters_per_rank(model, 1, 1)) == parameter_count(model)
    rest, experts = parameters_per_rank(model, 2, 4, layers=1)
    one_expert = 3 * model.hidden_size * model.moe_ffn_hidden_size
    assert experts == model.num_experts // 4 * one_expert // 2


@pytest.mark.parametrize(
    "recipe,expected",
    [
        (
            "grpo_deepseek_r1_671b_A3",
            [
                "384 devices = TP 4 x PP 6 x DP 16",
                "671B params, 37.6B active",
                "EP 64 = infer TP 2 x DP 32 (6 group(s)",
            ],
        ),
        ("grpo_deepseek_r1_671b_A3_48nodes", ["768 devices = TP 4 x PP 6 x DP 32", "256 experts over EP 16"]),
        ("grpo_deepseek_r1_671b_A3_eplb", ["eplb      : tokens per expert and MoE layer counted into"]),
    ],
)
def test_the_deepseek_r1_recipes_plan(recipe, expected, capsys):
    from cli import train_ppo

    assert train_ppo.main(["--config-name", recipe, "dry_run=true"]) == 0
    out = capsys.readouterr().out
    for text in expected + ["optimizer state about", "weights about"]:
        assert text in out, (text, out)


@pytest.mark.parametrize(
    "override,key",
    [
        ({"moe_router_num_groups": 3}, "moe_router_num_groups"),
        ({"moe_router_group_topk": None}, "moe_router_group_topk"),
        ({"moe_router_group_topk": 3}, "moe_router_group_topk"),
        ({"moe_router_topk": 5}, "moe_router_topk"),
        ({"first_k_dense_replace": 3}, "first_k_dense_replace"),
        ({"multi_latent_attention": False}, "multi_latent_attention"),
        ({"moe_router_score_function": "softmax"}, "moe_router_score_function"),
    ],
)
def test_a_model_section_that_contradicts_the_family_names_the_key(override, key):
    from mindspeed_rl.config_cls import ConfigError

    with pytest.raises(ConfigError, match=key):
        tiny("deepseek_v3", **override)


def test_a_folder_of_an_unknown_family_is_refused_naming_config_json(tmp_path, capsys):
    folder = _hf(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "mamba2", "architectures": ["Mamba2"]}))
    assert _convert(folder, tmp_path / "mg") == 2
    err = capsys.readouterr().err
    assert "config.json: model_type 'mamba2'" in err and "is not a supported family" in err and "Traceback" not in err


def test_the_hubs_fp8_block_quantized_weights_are_dequantized_by_the_converter(tmp_path):
    """DeepSeek-V3's Hub checkpoint stores its linear weights in FP8 with one fp32 factor per 128 x 128 block
    (``weight_scale_inv``); the converter reads them as q * s (here 64 x 64 blocks, the config's weight_block_size)."""
    import torch

    from mindspeed_rl.checkpoint.hf_io import HFReader
    from mindspeed_rl.checkpoint.megatron_reader import iter_mg_pieces

    folder = _hf(tmp_path)
    name = "model.layers.1.self_attn.kv_b_proj.weight"  # [4 x (32 + 32), 512]: 4 x 8 blocks
    original = HFReader(str(folder)).get(name)

    def quantize(tensors):
        w = tensors[name]
        scale = w.abs().reshape(4, 64, 8, 64).amax(dim=(1, 3)) / 448.0
        tensors[name] = (w / scale.repeat_interleave(64, 0).repeat_interleave(64, 1)).to(torch.float8_e4m3fn)
        tensors[name + "_scale_inv"] = scale

    _edit_tensors(folder, quantize)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 64]}
    (folder / "config.json").write_text(json.dumps(config))
    hf_to_mg(str(folder), str(tmp_path / "mg"))
    converted = {}
    for piece in iter_mg_pieces(str(tmp_path / "mg")):
        converted.update(piece)
    got = converted["decoder.layers.1.self_attention.linear_kv_up_proj.weight"]
    assert got.dtype == torch.float32 and (got - original).abs().max() <= 0.07 * original.abs().max()
    assert 0 < (got - original).abs().max()  # really the FP8 values, not the originals
    _edit_tensors(folder, lambda t: t.pop(name + "_scale_inv"))
    with pytest.raises(Exception, match="kv_b_proj.weight_scale_inv"):
        hf_to_mg(str(folder), str(tmp_path / "mg2"))


def test_vllm_on_cpu_is_refused_for_latent_sizes_its_mla_kernel_does_not_take():
    from mindspeed_rl.accelerator.cpu import CpuAccelerator
    from mindspeed_rl.compat.vllm import cpu_mla_unavailable
    from mindspeed_rl.rollout.engines.vllm_engine import vllm_unusable_reason

    reason = vllm_unusable_reason(tiny("deepseek_v3", kv_lora_rank=256), None, "cpu")
    assert reason == (
        cpu_mla_unavailable()
        or "vLLM's CPU MLA takes kv_lora_rank + qk_pos_emb_head_dim = 512 + 64 only; the model has 320"
    )
    assert vllm_unusable_reason(tiny("deepseek_v3"), None, "cpu") == (cpu_mla_unavailable() or None)
    assert vllm_unusable_reason(tiny("deepseek_v3", kv_lora_rank=256), None, "cuda") is None
    assert CpuAccelerator.vllm_unusable_reason(576) is not None  # not a standard attention head size
