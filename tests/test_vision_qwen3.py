"""Qwen3-VL through our stack against transformers' own model with the same weights (fp32): the tower with its
learned positions and DeepStack mergers, the interleaved 3D rotary, the whole model's log-probs with images
(DeepStack features added to the first layers), converters and the names sent to vLLM."""

import dataclasses

import pytest
import torch

from mindspeed_rl.checkpoint.convert import vl_state_to_mcore
from mindspeed_rl.families import get_family
from mindspeed_rl.families.parameters import parameter_count, vision_parameter_count
from mindspeed_rl.families.qwen2_5_vl import split_hf_state
from mindspeed_rl.families.vision.positions import interleaved_mrope, mrope_positions
from tests.helpers import hf_vl_logits, single_process_world_fixture

single_process_world = single_process_world_fixture(seed=5)
IMAGE = 250
GRIDS = torch.tensor([[1, 8, 12], [1, 4, 4]])  # 24 and 4 image tokens


def hf_config():
    from transformers import Qwen3VLConfig

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rms_norm_eps=1e-6,
            max_position_embeddings=512,
            rope_parameters=rope,
        ),
        vision_config=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            out_hidden_size=64,
            num_position_embeddings=16,  # a 4 x 4 table, resampled to each grid
            deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=IMAGE,
        vision_start_token_id=251,
        vision_end_token_id=252,
        video_token_id=253,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="module")
def hf_model():
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(hf_config()).float().eval()
    with torch.no_grad():  # non-trivial norms and biases
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("bias"):
                p.normal_(0, 0.05)
    return model


def prompts():
    """Row 0: text, image 1, text, image 2, text; row 1: left padding, text only."""
    g = torch.Generator().manual_seed(3)
    text = lambda n: torch.randint(1, 240, (n,), generator=g).tolist()  # noqa: E731
    row0 = text(5) + [251] + [IMAGE] * 24 + [252] + text(4) + [251] + [IMAGE] * 4 + [252] + text(6)
    row1 = text(20)
    width = len(row0)
    ids = torch.tensor([row0, [0] * (width - len(row1)) + row1])
    mask = torch.ones_like(ids)
    mask[1, : width - len(row1)] = 0
    pixels = torch.randn(int(GRIDS.prod(-1).sum()), 3 * 2 * 16 * 16, generator=g)
    return ids, mask, pixels


def test_tower_and_deepstack_features_equal_transformers(hf_model):
    family = get_family("qwen3_vl")
    tower = family.build_tower(family.plain_vision_config(hf_model.config.to_dict()["vision_config"])).eval()
    _, vision = split_hf_state(hf_model.state_dict())
    tower.load_state_dict(vision)
    _, _, pixels = prompts()
    with torch.no_grad():
        want = hf_model.model.visual(pixels, grid_thw=GRIDS)
        got, deep = tower(pixels, GRIDS)
    assert got.shape == (28, 64) and len(deep) == 2
    assert (got - want.pooler_output).abs().max().item() < 1e-5  # measured 2.2e-8
    for ours, theirs in zip(deep, want.deepstack_features):
        assert (ours - theirs).abs().max().item() < 1e-5


def test_interleaved_rotary_and_positions_equal_transformers(hf_model):
    ids, mask, _ = prompts()
    positions = mrope_positions(ids, mask, IMAGE, GRIDS, merge=2)
    want, _ = hf_model.model.get_rope_index(ids, (ids == IMAGE).int(), image_grid_thw=GRIDS, attention_mask=mask)
    assert torch.equal(positions[:, mask.bool()], want[:, mask.bool()])
    rotary = hf_model.model.language_model.rotary_emb
    cos, _ = rotary(torch.zeros(1, dtype=torch.float), positions)  # [B, S, head_dim]
    ours = interleaved_mrope(rotary.inv_freq, positions, [2, 3, 3])  # [S, B, 1, head_dim]
    assert torch.allclose(ours[:, :, 0].transpose(0, 1).cos(), cos, atol=1e-6)
    contiguous = torch.cat(
        [positions[i % 3, ..., None] * f for i, f in enumerate(rotary.inv_freq.split([2, 3, 3]))], -1
    )
    assert not torch.allclose(contiguous.cos(), cos[..., :8], atol=1e-3)  # megatron's own layout would differ


def test_log_probs_with_images_equal_transformers_and_deepstack_matters(hf_model, single_process_world):
    from mindspeed_rl.config_cls import MegatronConfig
    from mindspeed_rl.models.builder import build_gpt_model
    from mindspeed_rl.models.packing import megatron_attention_mask

    family = get_family("qwen3_vl")
    cfg = family.model_config_from_hf(hf_model.config.to_dict())
    assert (cfg.mrope_section, cfg.qk_layernorm, cfg.add_qkv_bias, cfg.head_dim) == ([2, 3, 3], True, False, 16)
    model = build_gpt_model(cfg, MegatronConfig(model="vl3")).eval()
    missing, unexpected = model.load_state_dict(vl_state_to_mcore(hf_model.state_dict(), cfg), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    ids, mask, pixels = prompts()
    positions = mrope_positions(ids, mask, IMAGE, GRIDS, merge=2)
    with torch.no_grad():
        ours = model(ids, positions, megatron_attention_mask(mask), pixel_values=pixels, image_grid_thw=GRIDS)
        theirs = hf_vl_logits(hf_model, ids, mask, pixels, GRIDS, IMAGE)
        with_deepstack = model.visual.cfg
        model.visual.cfg = dataclasses.replace(with_deepstack, deepstack_visual_indexes=())  # the same tower without
        flat = model(ids, positions, megatron_attention_mask(mask), pixel_values=pixels, image_grid_thw=GRIDS)
        model.visual.cfg = with_deepstack
    real = mask.bool()
    ours_lp, theirs_lp, flat_lp = (torch.log_softmax(t.float(), -1)[real] for t in (ours, theirs, flat))
    assert (ours_lp - theirs_lp).abs().max().item() < 1e-5  # measured 9.5e-7
    assert (flat_lp - theirs_lp).abs().max().item() > 1e-3  # without DeepStack: 0.45


def test_converters_round_trip_qwen3_vl_bit_exact_at_tp2_pp2_in_the_hub_layout(hf_model, tmp_path):
    """hf -> mcore at TP=2 x PP=2 -> hf: every tensor as it was, under transformers' names (model.language_model.*,
    model.visual.*), which vLLM's loader maps; the weights sent to vLLM carry the same names."""
    from safetensors.torch import load_file

    from cli import convert_ckpt
    from mindspeed_rl.rollout.weights.convert_names import hf_named

    hf_dir, mg_dir = tmp_path / "hf", tmp_path / "mg"
    hf_model.save_pretrained(hf_dir)
    common = ["--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"]
    to_mg = ["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", str(hf_dir), "--save-dir", str(mg_dir)]
    assert convert_ckpt.main(to_mg + common) == 0
    to_hf = ["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(mg_dir), "--save-dir", str(hf_dir)]
    assert convert_ckpt.main(to_hf) == 0
    original = load_file(hf_dir / "model.safetensors")
    back = {}
    for shard in (hf_dir / "mg2hf").glob("*.safetensors"):
        back.update(load_file(shard))
    assert sorted(back) == sorted(original)
    assert all(torch.equal(back[k], original[k]) for k in original)

    cfg = get_family("qwen3_vl").model_config_from_hf(hf_model.config.to_dict())
    piece = {"visual.pos_embed.weight": torch.zeros(2), "embedding.word_embeddings.weight": torch.ones(2)}
    assert set(dict(hf_named([piece], cfg))) == {
        "model.visual.pos_embed.weight",
        "model.language_model.embed_tokens.weight",
    }


def test_the_8b_recipe_plans_and_the_rules_refuse_what_deepstack_cannot_do(capsys, monkeypatch):
    """grpo_qwen3vl_8b_A3 validates on its A3 layout; the counts are transformers' (Qwen3-VL-8B: 8,767,123,696
    parameters, 576,388,336 of them the tower and its projectors); full recompute and a first pipeline stage
    shorter than DeepStack's layers are refused before anything starts."""
    from cli import train_ppo
    from mindspeed_rl.features import load_ppo_config
    from tests.helpers import assert_refused

    model = load_ppo_config("grpo_qwen3vl_8b_A3").actor.model
    assert (parameter_count(model), vision_parameter_count(model)) == (8_767_123_696, 576_388_336)
    assert vision_parameter_count(model, "projector") == 160_496_896
    assert train_ppo.main(["--config-name", "grpo_qwen3vl_8b_A3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "8.35B of 8.77B params train (the vision tower's 416M frozen)" in out, out
    run = ["--config-name", "grpo_tiny_cpu_vision_qwen3", "dry_run=true"]
    assert_refused(run + ["actor_config.recompute_granularity=full"], "recompute_granularity", "DeepStack", capsys)
    pp2 = ["actor_config.pipeline_model_parallel_size=2", "rl_config.actor_resource.num_npus=2"]
    deeper = "model.tiny_qwen3_vl.vision_config.deepstack_visual_indexes=[0,1]"  # two DeepStack features
    refusal = "the first stage holds 1 layers but tiny_qwen3_vl's DeepStack feeds the first 2"
    assert_refused(run + pp2 + [deeper], "actor_config.pipeline_model_parallel_size", refusal, capsys)
    assert train_ppo.main(run + pp2) == 0  # one feature: layer 0 sits on the first stage


def test_the_twin_counts_as_transformers_does():
    from mindspeed_rl.demo.tiny_hf import hf_config_for
    from mindspeed_rl.features import load_ppo_config

    model = load_ppo_config("grpo_tiny_cpu_vision_qwen3").actor.model
    with torch.device("meta"):
        from transformers import AutoModelForImageTextToText

        hf = AutoModelForImageTextToText.from_config(hf_config_for(model))
    assert type(hf).__name__ == "Qwen3VLForConditionalGeneration"
    assert sum(p.numel() for p in hf.parameters()) == parameter_count(model)
    assert sum(p.numel() for n, p in hf.named_parameters() if ".visual." in n) == vision_parameter_count(model)


def image_batch():
    """prompts() as a batch: row 0's two images padded into [B, P, D] patches and [B, I, 3] grids; row 1 none."""
    ids, mask, pixels = prompts()
    pixel_values = torch.zeros(2, pixels.shape[0], pixels.shape[1])
    pixel_values[0] = pixels
    grids = torch.zeros(2, 2, 3, dtype=torch.long)
    grids[0] = GRIDS
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixel_values, "image_grid_thw": grids}


def test_tp2_with_images_equals_tp1_and_keeps_the_replicated_towers_equal(hf_model, tmp_path, single_process_world):
    """The tower replicated over TP ranks (the recipes' TP 4): at TP 2 the log-probs of rows with images and one
    training step's loss and grad norm (the tower's gradients counted once) equal TP 1's, and after the step the
    two ranks' towers are still identical."""
    import json

    from mindspeed_rl.models.engine import MegatronEngine
    from tests import parallel_worker
    from tests.helpers import tiny_role

    cfg = get_family("qwen3_vl").model_config_from_hf(hf_model.config.to_dict())
    full = vl_state_to_mcore(hf_model.state_dict(), cfg)
    batch = image_batch()
    torch.save(full, tmp_path / "vl_full.pt")
    torch.save(batch, tmp_path / "vl_batch.pt")
    (tmp_path / "vl_model.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    layouts = [{"tp": 2, "name": "tp2"}]
    parallel_worker.spawn_each(2, [("run_vision", spec) for spec in layouts], tmp_path)

    engine = MegatronEngine(tiny_role(model=cfg), total_steps=2)
    engine.load_weights(full)
    ours = engine.forward(batch, micro_batch_size=1)["log_probs"]
    normaliser = float((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum())
    step = engine.train_step(batch, parallel_worker.global_sft_loss(normaliser), micro_batch_size=1)
    real = batch["attention_mask"].bool()
    for layout in layouts:
        tp2 = torch.load(tmp_path / f"vision_{layout['name']}.pt", weights_only=False)
        assert (tp2["log_probs"][real] - ours[real]).abs().max().item() < 1e-5, layout
        assert abs(tp2["loss"] - step.loss) < 1e-5 and abs(tp2["grad_norm"] - step.grad_norm) < 1e-4 * step.grad_norm
        first, second = tp2["towers"]
        assert first.keys() == second.keys() and len(first) > 10
        assert all(torch.equal(first[k], second[k]) for k in first), layout


def test_sequence_parallel_splices_the_whole_sequence_then_keeps_each_ranks_share(tmp_path):
    """With sequence parallelism (megatron's torch norms refuse it on CPU, so the splice alone, in a TP 2 world):
    each rank's decoder input is its half of the whole-sequence embedding with the image features spliced in,
    DeepStack's addition is split alike, and the features' gradient comes back whole (3 per element: once from
    the splice, twice from DeepStack's 2 x features)."""
    from tests import parallel_worker

    parallel_worker.spawn("run_sp_splice", 2, {}, tmp_path)
    for rank in torch.load(tmp_path / "sp_splice.pt", weights_only=False):
        assert rank["shape"] == (4, 2, 8)
        assert rank["decoder_input"] < 1e-6 and rank["deepstack"] < 1e-6, rank
        assert torch.equal(rank["grad"], torch.full((5, 8), 3.0)), rank["grad"]


def test_packed_rows_with_images_equal_padded_rows(hf_model, single_process_world):
    """use_remove_padding with images: the rows packed into one sequence, each real token keeping its 3D position
    (megatron-core 0.16's packed rotary takes one position per packed token) and the image features (DeepStack
    too) landing on the same tokens: log-probs equal transformers' as the padded rows' do, and a training step's
    loss and grad norm equal the padded rows'."""
    from mindspeed_rl.models.engine import MegatronEngine
    from tests import parallel_worker
    from tests.helpers import tiny_role

    cfg = get_family("qwen3_vl").model_config_from_hf(hf_model.config.to_dict())
    batch = image_batch()
    normaliser = float((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum())
    results = []
    for packed in (False, True):
        engine = MegatronEngine(tiny_role(model=cfg), total_steps=2, remove_padding=packed)
        engine.load_weights(vl_state_to_mcore(hf_model.state_dict(), cfg))
        log_probs = engine.forward(batch, micro_batch_size=2)["log_probs"]
        step = engine.train_step(batch, parallel_worker.global_sft_loss(normaliser), micro_batch_size=2)
        results.append((log_probs, step.loss, step.grad_norm))
    (padded, loss, norm), (packed_lp, packed_loss, packed_norm) = results
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        logits = hf_vl_logits(hf_model, ids, mask, batch["pixel_values"][0], GRIDS, IMAGE)
    theirs = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    real = (mask[:, 1:] * mask[:, :-1]).bool()
    for ours in (padded, packed_lp):
        assert (ours[:, 1:][real] - theirs[real]).abs().max().item() < 1e-5
    assert abs(packed_loss - loss) < 1e-5 and abs(packed_norm - norm) < 1e-4 * norm
