"""Qwen3-VL's MoE variant against transformers' own model (fp32): log-probs with images through the routed
layers, its fused-expert checkpoints read in either layout and written in the Hub's, and the names sent to vLLM."""

import pytest
import torch

from mindspeed_rl.checkpoint.convert import vl_state_to_mcore
from mindspeed_rl.families import get_family
from mindspeed_rl.families.parameters import parameter_count, vision_parameter_count
from mindspeed_rl.families.vision.positions import mrope_positions
from tests.helpers import hf_vl_logits, single_process_world_fixture
from tests.test_vision_qwen3 import GRIDS, IMAGE, prompts

single_process_world = single_process_world_fixture(seed=5)
EXPERTS, FFN, HIDDEN = 4, 16, 64  # hidden != 2 x ffn: the two fused layouts differ in shape


@pytest.fixture(scope="module")
def hf_model():
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    text = dict(vocab_size=256, hidden_size=HIDDEN, intermediate_size=160, moe_intermediate_size=FFN)
    text.update(num_experts=EXPERTS, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4)
    text.update(num_key_value_heads=2, head_dim=16, rope_parameters=rope, max_position_embeddings=512)
    vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=HIDDEN)
    vision.update(num_position_embeddings=16, deepstack_visual_indexes=[0])
    config = Qwen3VLMoeConfig(text_config=text, vision_config=vision, image_token_id=IMAGE, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3VLMoeForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("bias"):
                p.normal_(0, 0.05)
            if name.endswith("mlp.gate.weight") or "mlp.experts." in name:
                p.normal_(0, 0.5 if name.endswith("gate.weight") else 0.05)  # decisive routing, non-zero experts
    return model


def test_log_probs_with_images_equal_transformers_through_the_routed_layers(hf_model, single_process_world):
    from mindspeed_rl.config_cls import MegatronConfig
    from mindspeed_rl.models.builder import build_gpt_model
    from mindspeed_rl.models.packing import megatron_attention_mask

    cfg = get_family("qwen3_vl_moe").model_config_from_hf(hf_model.config.to_dict())
    assert (cfg.num_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size, cfg.norm_topk_prob) == (4, 2, FFN, True)
    assert parameter_count(cfg) == sum(p.numel() for p in hf_model.parameters())
    model = build_gpt_model(cfg, MegatronConfig(model="vl3moe")).eval()
    missing, unexpected = model.load_state_dict(vl_state_to_mcore(hf_model.state_dict(), cfg), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    ids, mask, pixels = prompts()
    positions = mrope_positions(ids, mask, IMAGE, GRIDS, merge=2)
    pixels = pixels[:, : 3 * 2 * 16 * 16]
    with torch.no_grad():
        ours = model(ids, positions, megatron_attention_mask(mask), pixel_values=pixels, image_grid_thw=GRIDS)
        theirs = hf_vl_logits(hf_model, ids, mask, pixels, GRIDS, IMAGE)
    real = mask.bool()
    ours_lp, theirs_lp = (torch.log_softmax(t.float(), -1)[real] for t in (ours, theirs))
    assert (ours_lp - theirs_lp).abs().max().item() < 1e-5  # measured 9.5e-7


def test_fused_experts_convert_both_ways_at_tp2_ep2(hf_model, tmp_path):
    """transformers' folder (its modules' expert layout) -> mcore at TP 2 x EP 2 -> hf in the Hub's layout (each
    fused tensor the transpose of transformers'); that folder -> mcore -> hf again: bit for bit."""
    from safetensors.torch import load_file

    from cli import convert_ckpt
    from mindspeed_rl.rollout.weights.convert_names import hf_named

    def round_trip(hf_dir, name):
        mg_dir = tmp_path / f"mg_{name}"
        common = ["--target-tensor-parallel-size", "2", "--target-expert-parallel-size", "2"]
        to_mg = ["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", str(hf_dir), "--save-dir"]
        assert convert_ckpt.main(to_mg + [str(mg_dir)] + common) == 0
        to_hf = ["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(mg_dir), "--save-dir"]
        assert convert_ckpt.main(to_hf + [str(hf_dir)]) == 0
        out = {}
        for shard in (hf_dir / "mg2hf").glob("*.safetensors"):
            out.update(load_file(shard))
        return out

    hf_dir = tmp_path / "hf"
    hf_model.save_pretrained(hf_dir)
    original = load_file(hf_dir / "model.safetensors")
    hub = round_trip(hf_dir, "transformers")
    assert sorted(hub) == sorted(original)
    fused = [k for k in original if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(fused) == 4 and hub[fused[0]].shape != original[fused[0]].shape
    assert all(torch.equal(hub[k], original[k].transpose(1, 2)) for k in fused)
    assert all(torch.equal(hub[k], original[k]) for k in original if k not in fused)
    again = round_trip(hf_dir / "mg2hf", "hub")
    assert all(torch.equal(again[k], hub[k]) for k in hub)

    cfg = get_family("qwen3_vl_moe").model_config_from_hf(hf_model.config.to_dict())
    sent = dict(hf_named([vl_state_to_mcore(hf_model.state_dict(), cfg)], cfg))  # to vLLM: one tensor per expert
    assert (
        "model.language_model.layers.1.mlp.experts.3.down_proj.weight" in sent
        and "model.visual.pos_embed.weight" in sent
    )
    assert not any(name.endswith("_proj") for name in sent)


def test_the_30b_a3b_recipe_plans_with_experts_and_sequence_parallelism(capsys):
    """grpo_qwen3vl_30b_a3b_A3 validates on its A3 layout (TP 4 with sequence parallelism, EP 4); its counts are
    transformers' (Qwen3-VL-30B-A3B: 31,070,754,032 parameters, 538,631,408 of them the tower and projectors)."""
    from cli import train_ppo
    from mindspeed_rl.features import load_ppo_config

    model = load_ppo_config("grpo_qwen3vl_30b_a3b_A3").actor.model
    assert (parameter_count(model), vision_parameter_count(model)) == (31_070_754_032, 538_631_408)
    assert train_ppo.main(["--config-name", "grpo_qwen3vl_30b_a3b_A3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "TP 4 x PP 1 x DP 4; model qwen3vl_30b_a3b (31.1B params, 3.89B active; 128 experts over EP 4)" in out, out
