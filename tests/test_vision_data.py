"""Preprocessing rows with images (R1VisionInstructionHandler): the pixel budget, the placeholder expansion, the
images stored inside the indexed dataset, and every bad row skipped and counted."""

import dataclasses
import io
import json

import pytest
from PIL import Image

from mindspeed_rl.config_cls import ConfigError
from mindspeed_rl.datasets.dataset_config import DatasetConfig
from mindspeed_rl.datasets.images import image_grid, unpack_images
from mindspeed_rl.datasets.preprocess import field_prefix, preprocess
from mindspeed_rl.demo.tiny_hf import build_tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]


def png(width, height, colour=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vl_tok")
    build_tokenizer(str(folder), ["what colour is the circle? how many squares? " * 20], 400, special_tokens=SPECIAL)
    return str(folder)


def config(tmp_path, tokenizer_dir, **overrides):
    values = dict(
        input=str(tmp_path / "rows.jsonl"),
        tokenizer_name_or_path=tokenizer_dir,
        output_prefix=str(tmp_path / "out" / "vl"),
        handler_name="R1VisionInstructionHandler",
        prompt_type="empty",
        map_keys={"prompt": "problem", "query": "", "response": "answer", "system": "", "image": "images"},
        dataset_additional_keys=["labels"],
        min_pixels=56 * 56,
        max_pixels=112 * 112,
        seq_length=200,
    )
    values.update(overrides)
    cfg = DatasetConfig(**values)
    cfg.check()
    return cfg


def test_images_are_fitted_stored_and_bad_rows_counted(tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    (data / "pics").mkdir(parents=True)
    for name, size in (("wide.png", (300, 100)), ("small.png", (56, 56)), ("thin.png", (2000, 5))):
        (data / "pics" / name).write_bytes(png(*size))
    rows = [  # images as paths relative to the input's folder
        {"problem": "<image>What colour is the circle?", "answer": "red", "images": ["pics/wide.png"]},
        {"problem": "<image>?", "answer": "1", "images": ["pics/nothing.png"]},  # missing file
        {"problem": "<image><image>?", "answer": "1", "images": ["pics/small.png"]},  # two markers, one image
        {"problem": "<image>?", "answer": "1", "images": "pics/thin.png"},  # 400:1
        {"problem": "<image>?", "answer": "1", "images": 7},  # not an image
        {"problem": "<image>" + " squares" * 300, "answer": "1", "images": ["pics/small.png"]},  # too long
    ]
    (data / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = lambda b: {"bytes": b, "path": None}  # noqa: E731 - HF datasets' image column in parquet
    table = pa.table(
        {
            "problem": ["How many squares?", "<image> then <image>", "<image>?"],
            "answer": ["2", "1", "1"],
            "images": [[record(png(20, 20))], [record(png(56, 56)), record(png(112, 112))], [record(b"junk")]],
        }
    )
    pq.write_table(table, data / "b.parquet")
    summary = preprocess(config(tmp_path, tokenizer_dir, input=str(data)), progress=False)
    assert summary["kept"] == 3, summary
    assert summary["skipped"] == {
        "image_missing": 1,
        "image_unreadable": 1,
        "image_count_mismatch": 1,
        "image_aspect_ratio": 1,
        "not_an_image_list:images": 1,
        "too_long": 1,
    }
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    ids = IndexedDataset(field_prefix(str(tmp_path / "out" / "vl"), "input_ids"))
    images = IndexedDataset(field_prefix(str(tmp_path / "out" / "vl"), "images"))
    for row in range(3):
        stored = unpack_images(images[row].tobytes())
        grids = [image_grid(p) for p in stored]
        for _, h, w in grids:  # within the budget, both sides multiples of 28
            assert 56 * 56 <= h * 14 * w * 14 <= 112 * 112 and h % 2 == 0 and w % 2 == 0
        assert list(ids[row]).count(pad) == sum(h * w // 4 for _, h, w in grids)  # one pad per image token
    assert [len(unpack_images(images[r].tobytes())) for r in range(3)] == [1, 1, 2]
    wide = Image.open(io.BytesIO(unpack_images(images[0].tobytes())[0]))
    assert wide.width > 2 * wide.height  # the aspect ratio kept (300 x 100 -> 168 x 56)


def test_vision_keys_are_checked_before_anything_runs(tmp_path, tokenizer_dir):
    with pytest.raises(ConfigError, match="map_keys.video"):
        config(tmp_path, tokenizer_dir, map_keys={"prompt": "p", "response": "a", "image": "i", "video": "v"})
    with pytest.raises(ConfigError, match="map_keys.image"):
        config(tmp_path, tokenizer_dir, map_keys={"prompt": "p", "response": "a"})
    with pytest.raises(ConfigError, match="handler_name"):
        config(tmp_path, tokenizer_dir, handler_name="R1AlpacaStyleInstructionHandler")
    with pytest.raises(ConfigError, match="min_pixels"):
        config(tmp_path, tokenizer_dir, min_pixels=10**6)
    text_only = tmp_path / "text_tok"
    build_tokenizer(str(text_only), ["plain words " * 10], 300)
    (tmp_path / "rows.jsonl").write_text(json.dumps({"problem": "x", "answer": "1", "images": []}) + "\n")
    with pytest.raises(ConfigError, match="tokenizer_name_or_path.*vision tokens"):
        preprocess(config(tmp_path, str(text_only)), progress=False)


def test_the_budget_takes_the_processors_patches_and_stays_inside_its_range(tmp_path, tokenizer_dir):
    """With Qwen3-VL's processor in the tokenizer folder a 56 x 56 picture is fitted in 32-pixel units (64 x 64:
    4 x 4 patches of 16, 4 image tokens); a dataset budget outside the processor's own is refused (vLLM would
    resize the stored picture again and the prompt's placeholders would miscount)."""
    import shutil

    from transformers import AutoTokenizer

    from mindspeed_rl.demo.vision_task import save_processor

    folder = tmp_path / "qwen3_tok"
    shutil.copytree(tokenizer_dir, folder)
    save_processor(str(folder), AutoTokenizer.from_pretrained(tokenizer_dir), 56 * 56, 4 * 56 * 56, "qwen3_vl")
    (tmp_path / "pic.png").write_bytes(png(56, 56))
    row = {"problem": "<image>What colour is the circle?", "answer": "red", "images": ["pic.png"]}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    cfg = config(tmp_path, str(folder), max_pixels=4 * 56 * 56)
    assert preprocess(cfg, progress=False)["kept"] == 1
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset

    stored = PromptDataset(cfg.output_prefix)[0]
    pad = AutoTokenizer.from_pretrained(tokenizer_dir).convert_tokens_to_ids("<|image_pad|>")
    assert image_grid(unpack_images(stored["images"])[0], 16) == (1, 4, 4) and list(stored["input_ids"]).count(pad) == 4
    with pytest.raises(ConfigError, match="max_pixels 20000 lies outside the image processor's"):
        preprocess(config(tmp_path, str(folder), max_pixels=20000), progress=False)
    with pytest.raises(ConfigError, match="min_pixels 1024 lies outside"):
        preprocess(config(tmp_path, str(folder), min_pixels=1024), progress=False)


def test_prompts_with_images_become_vllm_inputs_and_requests_split_with_their_images():
    from mindspeed_rl.config_cls.generate_config import SamplingConfig
    from mindspeed_rl.datasets.images import pack_images
    from mindspeed_rl.protocol.rollout import RolloutRequest
    from mindspeed_rl.rollout.engines.multimodal import collapse_image_runs, vllm_prompt

    pad = 5
    assert collapse_image_runs([1, 9, pad, pad, pad, 8, 9, pad, pad, 8, 2], pad) == [1, 9, pad, 8, 9, pad, 8, 2]
    stored = [1, 9] + [pad] * 16 + [8, 2]  # one 112 x 112 image: 16 tokens
    inputs = vllm_prompt(stored, pack_images([png(112, 112)]), pad)
    assert inputs["prompt_token_ids"] == [1, 9, pad, 8, 2]
    (image,) = inputs["multi_modal_data"]["image"]
    assert (image.size, image.mode) == ((112, 112), "RGB")
    assert vllm_prompt([1, 2], b"", pad) == {"prompt_token_ids": [1, 2]}
    with pytest.raises(ValueError, match="1 image placeholder runs carries 2 images"):
        vllm_prompt(stored, pack_images([png(56, 56), png(56, 56)]), pad)
    # a continued trajectory whose response sampled the placeholder: only the prompt's run collapses, the
    # sampled one stays a word (vLLM 0.32 then expands only the first: checked by hand)
    continued = vllm_prompt(stored + [pad, pad, 3], pack_images([png(112, 112)]), pad)
    assert continued["prompt_token_ids"] == [1, 9, pad, 8, 2, pad, pad, 3]

    blobs = [pack_images([png(56, 56)]), b"", pack_images([png(112, 56)])]
    request = dataclasses.replace(
        RolloutRequest.of([[1, pad], [2], [3, pad]], SamplingConfig(), n=2, seed=10), images=blobs
    )
    part = request.part([1, 2])
    assert part.images == blobs[1:] and part.seed == 12
    other = dataclasses.replace(request, images=[blobs[0], b"", pack_images([png(56, 112)])])  # another picture
    assert request.digest(1) != other.digest(1)  # ranks given different images are told apart


def test_a_rows_images_are_encoded_once_for_scoring_and_for_the_batch():
    """The rollout source encodes a batch's images for its scorer and again for the experience: the encoder keeps
    the last rows' encodings, bounded."""
    from mindspeed_rl.datasets.images import ImageEncoder, pack_images

    encoder = ImageEncoder()
    calls = []
    processor = encoder.processor
    encoder.processor = lambda **kwargs: calls.append(1) or processor(**kwargs)
    blob = pack_images([png(56, 56)])
    first = encoder.encode(blob)
    assert encoder.encode(bytes(blob)) is first and len(calls) == 1 and first[1].tolist() == [[1, 4, 4]]
    encoder.CACHED = 2
    for colour in ((1, 2, 3), (4, 5, 6)):
        encoder.encode(pack_images([png(56, 56, colour)]))
    encoder.encode(blob)  # pushed out by the two newer rows: encoded again
    assert len(calls) == 4
