"""Qwen3-Next (Gated DeltaNet linear attention, gated full attention, a gated shared expert, zero-centred norms) and
Qwen3.5 (text: the same layers over a dense MLP, separate Gated DeltaNet projections): transformers' logits through our
engine (fp32, left-padded rows and packed rows), the refusals with their keys.
The exact round trips at TP / PP / EP, TP 2 parity and the GRPO run are in tests/test_families.py."""

import json

import pytest
import torch

from mindspeed_rl.checkpoint.convert import hf_to_mg
from mindspeed_rl.checkpoint.engine_io import load_weights_only
from mindspeed_rl.demo.tiny_hf import build_hf_model
from mindspeed_rl.families import FamilyError, family_of_hf_config, get_family
from mindspeed_rl.models.engine import MegatronEngine
from tests.helpers import assert_refused, single_process_world_fixture, tiny_role
from tests.helpers import tiny_family_model as tiny

single_process_world = single_process_world_fixture(seed=11)


def rows_of_every_length(rows=6, width=24, seed=0):
    """Left-padded prompts and right-padded responses, lengths 3 .. width (the rule's 64-token chunks and the
    conv's 4-token window both see padding and row starts)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (rows, width), generator=g)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for b in range(rows):
        start, end = (b * 5) % 9, width - (b * 3) % 7
        mask[b, start:end] = 1
    return {"input_ids": ids * mask, "attention_mask": mask}


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "qwen3_5_moe"])
def test_logits_equal_transformers_and_packed_rows_equal_padded(family, tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny(family)
    build_hf_model(str(tmp_path / "hf"), model, seed=5)
    hf_to_mg(str(tmp_path / "hf"), str(tmp_path / "mg"))
    engine = MegatronEngine(tiny_role(model=model), trainable=False)
    load_weights_only(engine, str(tmp_path / "mg"))
    batch = rows_of_every_length()
    real = batch["attention_mask"].bool()
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(**batch).logits
    padded = engine.forward(batch, micro_batch_size=3, with_logits=True)
    diff = (padded["logits"] - want)[real].abs().max().item()
    print(family, "largest logit difference from transformers (fp32):", diff)  # shown with -s
    assert diff <= 2e-5
    engine.remove_padding = True  # each packed row restarts the conv window and the recurrent state
    packed = engine.forward(batch, micro_batch_size=3)
    keep = real[:, 1:] & real[:, :-1]
    assert torch.allclose(packed["log_probs"][:, 1:][keep], padded["log_probs"][:, 1:][keep], atol=1e-5)


def test_the_layer_pattern_is_read_from_layer_types_and_an_irregular_one_is_refused():
    model = tiny("qwen3_next", num_layers=8, linear_attention_freq=2)
    hf = get_family("qwen3_next").hf_config(model, 0, 0)
    assert hf["layer_types"][:4] == ["linear_attention", "full_attention"] * 2
    assert family_of_hf_config(hf).model_config_from_hf(hf).linear_attention_freq == 2
    hf["layer_types"][1] = "linear_attention"
    with pytest.raises(FamilyError, match=r"full attention at layers \[3, 5, 7\]"):
        family_of_hf_config(hf).model_config_from_hf(hf)


def test_multi_token_prediction_tensors_are_reported_not_converted(tmp_path, caplog):
    import logging

    from safetensors.torch import save_file

    build_hf_model(str(tmp_path / "hf"), tiny("qwen3_next"), seed=5)
    save_file({"mtp.fc.weight": torch.zeros(4, 4)}, str(tmp_path / "hf" / "mtp.safetensors"))
    index = tmp_path / "hf" / "model.safetensors.index.json"
    weights = {"weight_map": {**_weight_map(tmp_path / "hf"), "mtp.fc.weight": "mtp.safetensors"}}
    index.write_text(json.dumps(weights))
    with caplog.at_level(logging.WARNING):
        hf_to_mg(str(tmp_path / "hf"), str(tmp_path / "mg"))
    assert "1 tensors of multi-token-prediction layers not converted" in caplog.text


def _weight_map(folder):
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {name: "model.safetensors" for name in f.keys()}


def test_configs_as_the_hub_writes_them_route_as_transformers_does():
    """Qwen3-Next's config may omit norm_topk_prob (transformers' default: true); Qwen3.5-MoE's text config has neither
    it (its router always renormalises) nor a dense intermediate_size."""
    nxt = get_family("qwen3_next").hf_config(tiny("qwen3_next"), 0, 0)
    del nxt["norm_topk_prob"]
    assert family_of_hf_config(nxt).model_config_from_hf(nxt).norm_topk_prob is True
    moe = get_family("qwen3_5_moe").hf_config(tiny("qwen3_5_moe"), 0, 0)
    for key in ("norm_topk_prob", "intermediate_size"):
        del moe[key]
    model = family_of_hf_config(moe).model_config_from_hf(moe)
    assert model.norm_topk_prob is True and model.ffn_hidden_size == moe["moe_intermediate_size"]


MODEL = ["megatron_training.model=tiny_qwen3_next", "actor_config.model=tiny_qwen3_next"]


@pytest.mark.parametrize(
    "extra,key,text",
    [
        (["actor_config.lora_r=8"], "actor_config.lora_r", "Gated DeltaNet"),
        (
            ["actor_config.context_parallel_size=2", "rl_config.actor_resource.num_npus=2"],
            "actor_config.context_parallel_size",
            "along the whole sequence",
        ),
    ],
)
def test_features_gated_deltanet_does_not_run_with_are_refused_naming_the_key(extra, key, text, capsys):
    assert_refused(["--config-name", "grpo_tiny_cpu", "dry_run=true"] + MODEL + extra, key, text, capsys)


def test_vllm_on_cpu_is_refused_in_float32_and_for_other_head_sizes():
    from mindspeed_rl.accelerator.cpu import CpuAccelerator

    assert "bfloat16 only" in CpuAccelerator.vllm_unusable_reason(64, linear_head_dims=(128, 128), dtype="float32")
    assert "128 only" in CpuAccelerator.vllm_unusable_reason(64, linear_head_dims=(64, 128), dtype="bfloat16")
    assert (
        CpuAccelerator.vllm_unusable_reason(64, linear_head_dims=(128, 128), dtype="bfloat16", native_bf16=True) is None
    )
    # its kernel stops on a CPU without native bf16 (AVX2)
    without = CpuAccelerator.vllm_unusable_reason(64, linear_head_dims=(128, 128), dtype="bfloat16", native_bf16=False)
    assert "needs native bf16" in without


def test_the_80b_recipe_plans_its_layout(capsys):
    from cli import train_ppo

    assert train_ppo.main(["--config-name", "grpo_qwen3_next_80b_a3b_A3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "model qwen3_next_80b_a3b (79.7B params, 3.87B active; 512 experts over EP 8)" in out, out
    assert "infer TP 8 x PP 1, 8 engine(s)" in out and "TP 2 x PP 4 x DP 8" in out


def test_infer_tp_may_replicate_query_groups_but_must_split_the_linear_heads(capsys):
    recipe = ["--config-name", "grpo_qwen3_next_80b_a3b_A3", "dry_run=true"]
    assert_refused(
        recipe + ["generate_config.infer_tensor_parallel_size=32"],
        "generate_config.infer_tensor_parallel_size",
        "does not divide the heads (16)",
        capsys,
    )
    assert_refused(
        recipe + ["generate_config.infer_tensor_parallel_size=32", "model.qwen3_next_80b_a3b.num_attention_heads=32"],
        "generate_config.infer_tensor_parallel_size",
        "Gated DeltaNet key and value heads (16, 32)",
        capsys,
    )


def test_a_vision_language_qwen3_5_checkpoint_trains_as_its_text_model(tmp_path, caplog):
    """The Hub's Qwen3.5 is a vision-language model (``model.language_model.*``, ``model.visual.*``, text_config): it
    converts as the text model (the tower counted, not converted), whose logits on text are the VL model's."""
    import logging

    from transformers import AutoConfig, AutoModelForImageTextToText

    from mindspeed_rl.checkpoint.hf_io import read_hf_model_config

    text = get_family("qwen3_5").hf_config(tiny("qwen3_5"), 0, 0)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128, patch_size=8)
    config = AutoConfig.for_model("qwen3_5", text_config=text, vision_config=vision)
    torch.manual_seed(0)
    vl = AutoModelForImageTextToText.from_config(config).float().eval()
    vl.save_pretrained(str(tmp_path / "vl"))
    assert read_hf_model_config(str(tmp_path / "vl")).model_type_hf == "qwen3_5"
    with caplog.at_level(logging.WARNING):
        hf_to_mg(str(tmp_path / "vl"), str(tmp_path / "mg"))
    towers = sum(n.startswith("model.visual.") for n in vl.state_dict())
    assert f"{towers} tensors of multi-token-prediction layers or the vision tower not converted" in caplog.text
    engine = MegatronEngine(tiny_role(model=tiny("qwen3_5")), trainable=False)
    load_weights_only(engine, str(tmp_path / "mg"))
    batch = rows_of_every_length(rows=3, width=12)
    with torch.no_grad():
        want = vl(**batch).logits
    got = engine.forward(batch, micro_batch_size=3, with_logits=True)["logits"]
    assert (got - want)[batch["attention_mask"].bool()].abs().max().item() <= 2e-5
