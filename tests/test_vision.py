"""Qwen2.5-VL through our stack against transformers' own model with the same weights (fp32): the 3D rotary
positions, the vision tower, and the whole model's log-probs with images in the prompt."""

import pytest
import torch

from mindspeed_rl.checkpoint.convert import vl_state_to_mcore
from mindspeed_rl.families import get_family
from mindspeed_rl.families.parameters import parameter_count, vision_parameter_count
from mindspeed_rl.families.qwen2_5_vl import split_hf_state
from mindspeed_rl.families.vision.positions import mrope_positions, window_order
from mindspeed_rl.families.vision.qwen25_vit import Qwen25VisionTower
from tests.helpers import hf_vl_logits, single_process_world_fixture

single_process_world = single_process_world_fixture(seed=5)
IMAGE = 250
# two images: 8 x 12 patches (24 tokens, 2 x 3 windows of 2 x 2 merged tokens) and 4 x 4 (4 tokens)
GRIDS = torch.tensor([[1, 8, 12], [1, 4, 4]])


def hf_config():
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            out_hidden_size=64,
            window_size=56,  # 4 patches: windows of 2 x 2 merged tokens
            fullatt_block_indexes=[1],
        ),
        image_token_id=IMAGE,
        vision_start_token_id=251,
        vision_end_token_id=252,
        video_token_id=253,
    )


@pytest.fixture(scope="module")
def hf_model():
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(hf_config()).float().eval()
    with torch.no_grad():  # non-trivial norms and biases
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("ln_q.weight"):
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
    pixels = torch.randn(int(GRIDS.prod(-1).sum()), 3 * 2 * 14 * 14, generator=g)
    return ids, mask, pixels


def test_window_order_makes_windows_contiguous():
    order, bounds = window_order(torch.tensor([[1, 8, 12]]), merge=2, window_patches=4)
    assert sorted(order.tolist()) == list(range(24))
    assert order[:4].tolist() == [0, 1, 6, 7]  # the first 2 x 2 window of a 4 x 6 merged grid
    assert bounds == [0, 16, 32, 48, 64, 80, 96]


def test_mrope_positions_equal_transformers(hf_model):
    ids, mask, _ = prompts()
    want, _ = hf_model.model.get_rope_index(ids, (ids == IMAGE).int(), image_grid_thw=GRIDS, attention_mask=mask)
    got = mrope_positions(ids, mask, IMAGE, GRIDS, merge=2)
    assert torch.equal(got[:, mask.bool()], want[:, mask.bool()])


def test_vision_tower_equals_transformers(hf_model):
    family = get_family("qwen2_5_vl")
    tower = Qwen25VisionTower(family.vision_config(hf_model.config.to_dict())).eval()
    _, vision = split_hf_state(hf_model.state_dict())
    tower.load_state_dict(vision)
    _, _, pixels = prompts()
    with torch.no_grad():
        want = hf_model.model.visual(pixels, grid_thw=GRIDS).pooler_output
        got = tower(pixels, GRIDS)
    assert got.shape == (28, 64)
    assert (got - want).abs().max().item() < 1e-5


def test_vision_language_log_probs_equal_transformers(hf_model, single_process_world):
    from mindspeed_rl.config_cls import MegatronConfig
    from mindspeed_rl.models.builder import build_gpt_model
    from mindspeed_rl.models.packing import megatron_attention_mask

    family = get_family("qwen2_5_vl")
    hf = hf_model.config.to_dict()
    cfg = family.model_config_from_hf(hf)
    assert cfg.position_embedding_type == "mrope" and cfg.mrope_section == [2, 3, 3] and cfg.image_token_id == IMAGE
    model = build_gpt_model(cfg, MegatronConfig(model="vl")).eval()  # the family attaches the tower
    missing, unexpected = model.load_state_dict(vl_state_to_mcore(hf_model.state_dict(), cfg), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)

    ids, mask, pixels = prompts()
    positions = mrope_positions(ids, mask, IMAGE, GRIDS, merge=2)
    with torch.no_grad():
        ours = model(ids, positions, megatron_attention_mask(mask), pixel_values=pixels, image_grid_thw=GRIDS)
        theirs = hf_vl_logits(hf_model, ids, mask, pixels, GRIDS, IMAGE)
    real = mask.bool()
    ours_lp, theirs_lp = (torch.log_softmax(t.float(), -1)[real] for t in (ours, theirs))
    assert (ours_lp - theirs_lp).abs().max().item() < 1e-5  # measured 9.5e-7; other pixels move them 0.88


def test_the_family_and_the_run_refuse_what_the_vision_path_cannot_do(capsys, tmp_path):
    from cli import train_ppo
    from mindspeed_rl.config_cls import ConfigError
    from mindspeed_rl.trainer.startup.config_names import build_checked_model

    section = dict(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=160,
        num_attention_heads=4,
        max_position_embeddings=512,
        padded_vocab_size=256,
        position_embedding_type="mrope",
        mrope_section=[2, 3, 3],
        model_type_hf="qwen2_5_vl",
        image_token_id=5,
    )
    with pytest.raises(ConfigError, match="model.tiny_vl.vision_config.*vision tower"):
        build_checked_model(section, "model.tiny_vl")
    with pytest.raises(ConfigError, match="mrope_section.*sum"):
        build_checked_model(dict(section, mrope_section=[2, 2, 2]), "model.tiny_vl")
    run = ["--config-name", "grpo_tiny_cpu_vision", "dry_run=true"]
    refusals = [
        (["generate_config.backend=fallback"], "generate_config.backend", "text only"),
        (
            ["actor_config.context_parallel_size=2", "rl_config.actor_resource.num_npus=2"],
            "actor_config.context_parallel_size",
            "3D positions",
        ),
    ]
    for overrides, key, text in refusals:
        assert train_ppo.main(run + overrides) == 2, overrides
        err = capsys.readouterr().err
        assert key in err and text in err and "Traceback" not in err, err
    # a tokenizer folder without the image processor is refused before anything starts
    (tmp_path / "tokenizer.json").write_text("{}")
    assert train_ppo.main(run[:2] + [f"megatron_training.tokenizer_name_or_path={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert (
        "megatron_training.tokenizer_name_or_path" in err
        and "no preprocessor_config.json or processor_config.json" in err
    ), err
    assert "prepare_demo.py --vision" in err, err


def test_torchvision_imports_on_the_cpu_stack_and_the_image_processor_keeps_the_pixel_budget():
    """scripts/install.sh puts PyPI's torchvision beside torch's CPU build with the hook of
    scripts/torchvision_ops.py: the import works, the Qwen2-VL image processor resizes within min/max pixels, and
    the C++ operators that cannot load fail when called rather than computing anything."""
    import torchvision
    from PIL import Image
    from transformers import Qwen2VLImageProcessor

    processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112)
    out = processor(images=[Image.new("RGB", (200, 90), (0, 255, 0))], return_tensors="pt")
    t, h, w = out["image_grid_thw"][0].tolist()
    assert (t, h * 14 * w * 14 <= 112 * 112, h * 14 * w * 14 >= 56 * 56) == (1, True, True)
    assert out["pixel_values"].shape == (h * w, 3 * 2 * 14 * 14)
    if not torchvision.extension._has_ops():
        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
        with pytest.raises((RuntimeError, NotImplementedError)):
            torchvision.ops.nms(boxes, torch.ones(1), 0.5)


def test_converters_round_trip_qwen25_vl_bit_exact_at_tp2_pp2(hf_model, tmp_path):
    """hf -> mcore at TP=2 x PP=2 (the tower on stage 0, replicated over TP) -> hf: every tensor as it was."""
    from safetensors.torch import load_file

    from cli import convert_ckpt

    hf_dir, mg_dir = tmp_path / "hf", tmp_path / "mg"
    hf_model.save_pretrained(hf_dir)
    common = ["--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"]
    assert (
        convert_ckpt.main(
            ["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", str(hf_dir), "--save-dir", str(mg_dir)]
            + common
        )
        == 0
    )
    stage0 = torch.load(mg_dir / "release" / "mp_rank_01_000" / "model_optim_rng.pt", weights_only=False)["model"]
    assert any(k.startswith("visual.blocks.") for k in stage0)  # TP rank 1 of stage 0 holds the whole tower
    assert (
        convert_ckpt.main(
            ["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(mg_dir), "--save-dir", str(hf_dir)]
        )
        == 0
    )
    original = load_file(hf_dir / "model.safetensors")
    back = {}
    for shard in (hf_dir / "mg2hf").glob("*.safetensors"):
        back.update(load_file(shard))
    assert sorted(back) == sorted(original)
    assert all(torch.equal(back[k], original[k]) for k in original)
    # --orm: a critic or reward model started from the vision model keeps its tower, with a new value head
    orm_dir = tmp_path / "orm"
    assert convert_ckpt.main(["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", str(hf_dir),
                              "--save-dir", str(orm_dir), "--orm"]) == 0  # fmt: skip
    from mindspeed_rl.checkpoint import megatron_layout as ml

    state = ml.load_rank(str(orm_dir), 0, 0)["model"]
    assert tuple(state["output_layer.weight"].shape) == (1, 64)
    assert torch.equal(state["visual.blocks.0.attn.qkv.weight"], original["visual.blocks.0.attn.qkv.weight"])


def image_batch():
    """prompts() as a batch: each row's images padded ([B, P, D] patches, [B, I, 3] grids; zeros where none)."""
    ids, mask, pixels = prompts()
    patches = int(GRIDS.prod(-1).sum())
    pixel_values = torch.zeros(2, patches, pixels.shape[1])
    pixel_values[0] = pixels  # both images belong to row 0; row 1 is text
    grids = torch.zeros(2, 2, 3, dtype=torch.long)
    grids[0] = GRIDS
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixel_values, "image_grid_thw": grids}


def test_engine_forward_with_images_equals_transformers_and_training_reaches_the_tower(hf_model, single_process_world):
    """MegatronEngine on a batch with images, one row per micro-batch (the text row's micro-batch has none)."""
    from mindspeed_rl.config_cls import MegatronConfig, RoleConfig
    from mindspeed_rl.models.engine import MegatronEngine

    family = get_family("qwen2_5_vl")
    cfg = family.model_config_from_hf(hf_model.config.to_dict())
    engine = MegatronEngine(RoleConfig("actor", MegatronConfig(model="vl", lr=1e-3), cfg, 1), total_steps=4)
    engine.load_weights(vl_state_to_mcore(hf_model.state_dict(), cfg))
    batch = image_batch()
    ours = engine.forward(batch, micro_batch_size=1)["log_probs"]
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        logits = hf_vl_logits(hf_model, ids, mask, batch["pixel_values"][0], GRIDS, IMAGE)
    theirs = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    real = (mask[:, 1:] * mask[:, :-1]).bool()
    assert (ours[:, 1:][real] - theirs[real]).abs().max().item() < 1e-5

    tower = {n: p.detach().clone() for n, p in engine.unwrapped().named_parameters() if n.startswith("visual.")}

    def loss_fn(outputs, mb):
        m = (mb["attention_mask"][:, 1:] * mb["attention_mask"][:, :-1]).float()
        return -(outputs["log_probs"][:, 1:] * m).sum() / m.sum(), {}

    assert not engine.train_step(batch, loss_fn, micro_batch_size=1).skipped
    moved = [n for n, p in engine.unwrapped().named_parameters() if n in tower and not torch.equal(p, tower[n])]
    assert len(moved) == len(tower)  # every tower weight is trained through the spliced tokens


def test_weight_sync_names_include_the_tower(hf_model):
    """What the actor sends vLLM (rollout/convert_names.hf_named) holds the tower under the Hub's names."""
    from mindspeed_rl.rollout.weights.convert_names import hf_named

    cfg = get_family("qwen2_5_vl").model_config_from_hf(hf_model.config.to_dict())
    piece = {"visual.blocks.0.attn.qkv.weight": torch.zeros(3, 3), "embedding.word_embeddings.weight": torch.ones(2)}
    names = dict(hf_named([piece], cfg))
    assert set(names) == {"visual.blocks.0.attn.qkv.weight", "model.embed_tokens.weight"}


def test_a_sampled_placeholder_is_a_word_and_pixel_rows_follow_their_rows():
    """A response that samples the image token holds it as a word (vLLM embeds it so): only the prompt's image
    runs take features and 3D positions. The experience keeps each row's images through select and cat, and the
    worker's inputs hold each row's own pixels."""
    from mindspeed_rl.families.vision.positions import image_layout
    from mindspeed_rl.protocol.experience import Experience
    from mindspeed_rl.protocol.experience_rows import image_fields

    ids = torch.tensor([[7, IMAGE, IMAGE, IMAGE, IMAGE, 8, IMAGE, 9], [0, 0, 7, 8, IMAGE, 9, 9, 9]])
    mask = torch.tensor([[1] * 8, [0, 0] + [1] * 6])
    grids = torch.tensor([[1, 4, 4]])  # row 0's one image: 2 x 2 merged tokens; row 1 has none
    positions, filled = image_layout(ids, mask, IMAGE, grids, 2, images_per_row=[1, 0])
    assert filled.tolist() == [[False, True, True, True, True, False, False, False], [False] * 8]
    assert positions[:, 0].tolist() == [[0, 1, 1, 1, 1, 3, 4, 5], [0, 1, 1, 2, 2, 3, 4, 5], [0, 1, 2, 1, 2, 3, 4, 5]]
    assert positions[:, 1, 2:].tolist() == [list(range(6))] * 3  # text positions after the left padding
    pixels = [(torch.full((16, 6), float(i + 1)), torch.tensor([[1, 4, 4]])) for i in range(2)]
    pixels.append((torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long)))  # a prompt without an image
    fields = image_fields([pixels[i // 2] for i in range(6)])  # two rows per prompt
    assert fields["pixel_values"].shape == (6, 16, 6) and fields["image_grid_thw"][4:].sum() == 0
    blobs = [b"one", b"two", b""]
    exp = Experience(
        prompt_width=1,
        input_ids=torch.zeros(6, 2, dtype=torch.long),
        attention_mask=torch.ones(6, 2),
        response_mask=torch.ones(6, 1, dtype=torch.long),
        images=[blobs[i // 2] for i in range(6)],
    )
    picked = exp.select([5, 2])
    assert picked.images == [b"", b"two"]
    wider = Experience.cat([picked, exp.select([0])])
    assert wider.images == [b"", b"two", b"one"]


def test_the_7b_and_32b_recipes_plan_their_images_and_their_tower(capsys, monkeypatch):
    """grpo_qwen25vl_7b_A3 and _32b_A3 validate on their A3 layouts; the plan counts the tower (Qwen2.5-VL-7B: 8.29B
    parameters, 0.68B of them the vision tower and projector) and what the images cost."""
    from cli import train_ppo
    from mindspeed_rl.features import load_ppo_config

    model = load_ppo_config("grpo_qwen25vl_7b_A3").actor.model
    assert (round(parameter_count(model) / 1e9, 2), round(vision_parameter_count(model) / 1e9, 2)) == (8.29, 0.68)
    assert train_ppo.main(["--config-name", "grpo_qwen25vl_7b_A3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "7.66B of 8.29B params train (the vision tower's 632M frozen)" in out, out
    assert "actor img : up to 2048 image tokens per prompt" in out and "no activations kept: frozen" in out, out
    monkeypatch.setenv("NPUS_PER_NODE", "16")
    assert train_ppo.main(["--config-name", "grpo_qwen25vl_32b_A3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "2 nodes x 16" in out and "TP 8 x PP 1 x DP 4; model qwen25vl_32b (33.5B params)" in out, out


def test_a_vision_critic_values_image_rows_and_freezing_keeps_the_tower(hf_model, single_process_world):
    """The value head on the vision model (a PPO critic or reward model started from it): values depend on the
    pixels, and with freeze_vision_tower a step moves the projector and not the tower's blocks."""
    from mindspeed_rl.config_cls import MegatronConfig, RoleConfig
    from mindspeed_rl.models.engine import MegatronEngine

    cfg = get_family("qwen2_5_vl").model_config_from_hf(hf_model.config.to_dict())
    role = RoleConfig("critic", MegatronConfig(model="vl", lr=1e-3, freeze_vision_tower=True), cfg, 1)
    critic = MegatronEngine(role, head="value", total_steps=2)
    weights = vl_state_to_mcore(hf_model.state_dict(), cfg)
    weights["output_layer.weight"] = 0.5 * torch.randn(1, cfg.hidden_size)  # a value head, as --orm starts one
    critic.load_weights(weights)
    batch = image_batch()
    values = critic.forward(batch, micro_batch_size=2)["raw_values"]
    other = dict(batch, pixel_values=batch["pixel_values"].flip(1))
    assert values.shape == batch["input_ids"].shape
    assert not torch.allclose(values[0], critic.forward(other, micro_batch_size=2)["raw_values"][0])
    before = {n: p.detach().clone() for n, p in critic.unwrapped().named_parameters() if n.startswith("visual.")}

    def loss_fn(outputs, mb):
        return (outputs["raw_values"] ** 2).mean(), {}

    assert not critic.train_step(batch, loss_fn, micro_batch_size=2).skipped
    moved = {n for n, p in critic.unwrapped().named_parameters() if n in before and not torch.equal(p, before[n])}
    assert moved and all(n.startswith("visual.merger.") for n in moved), sorted(moved)
