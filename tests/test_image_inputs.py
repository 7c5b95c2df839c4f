"""Hostile images. At preprocessing: decompression bombs and broken files are skipped and counted, never a
traceback, and an image over max_image_pixels is refused from its header before any decoding. In a prepared
dataset: a stored image damaged afterwards skips its row where it is drawn (counted in the batch's metrics). At
start: a dataset with images for a model that reads text only is refused before anything starts."""

import io
import json
import random
import struct
import zlib

import pytest
from PIL import Image

from mindspeed_rl.datasets.dataset_config import DatasetConfig
from mindspeed_rl.datasets.preprocess import field_prefix, preprocess
from mindspeed_rl.demo.tiny_hf import build_tokenizer
from tests.test_vision_data import config

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]


def png(width, height, seed=None) -> bytes:
    """A PNG: one colour, or noise with ``seed`` (its pixel data then fills most of the file)."""
    if seed is None:
        image = Image.new("RGB", (width, height), (200, 30, 30))
    else:
        rng = random.Random(seed)
        image = Image.frombytes("RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3)))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def claimed_png(width, height) -> bytes:
    """A PNG whose header claims width x height RGB pixels (CRCs correct) and whose data holds a few bytes: a
    reader that trusted the header would allocate it all, one that decoded it would find it truncated."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = zlib.compress(b"\0" * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def claimed_gif(width, height) -> bytes:
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0)
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x44\x01\x00"
    return screen + frame + b"\x3b"


def broken_png() -> bytes:
    """A valid signature and header chunk, then a chunk whose type is not letters: Pillow's 'broken PNG file'."""
    good = png(8, 8)
    return good[:33] + b"\x00\x00\x00\x0d\xff\xfe\xfd\xfc" + good[41:]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vl_tok")
    build_tokenizer(str(folder), ["what colour is the circle? how many squares? " * 20], 400, special_tokens=SPECIAL)
    return str(folder)


def write_rows(tmp_path, pictures) -> None:
    """One row per picture (name -> bytes), the picture beside the rows file."""
    rows = []
    for name, data in pictures.items():
        (tmp_path / name).write_bytes(data)
        rows.append({"problem": "<image>What colour?", "answer": "red", "images": [name]})
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("workers", [1, 2])
def test_bombs_and_broken_images_are_skipped_and_counted_from_their_headers(tmp_path, tokenizer_dir, workers):
    pictures = {
        "bomb.png": claimed_png(30000, 30000),  # over Pillow's own refusal (DecompressionBombError)
        "between.png": claimed_png(9400, 9400),  # 88M pixels: under Pillow's warning, over max_image_pixels
        "bomb.gif": claimed_gif(30000, 30000),
        "broken.png": broken_png(),  # SyntaxError: broken PNG file
        "truncated.png": png(56, 56, seed=1)[:-200],
        "good.png": png(56, 56, seed=2),
    }
    write_rows(tmp_path, pictures)
    summary = preprocess(config(tmp_path, tokenizer_dir, workers=workers), progress=False)
    # 'between.png' is too large, not unreadable: refused from its header, its (absent) pixels never decoded
    assert summary["skipped"] == {"image_too_large": 3, "image_unreadable": 2}, summary
    assert summary["kept"] == 1
    assert any(line.startswith("rows.jsonl:2: image_too_large") for line in summary["examples"]), summary


def test_max_image_pixels_is_the_limit_and_is_bounded_by_pillows_own(tmp_path, tokenizer_dir):
    from mindspeed_rl.config_cls import ConfigError
    from mindspeed_rl.config_cls.base import build_section

    write_rows(tmp_path, {"a.png": png(56, 56), "b.png": png(40, 40), "c.png": png(60, 60)})
    summary = preprocess(config(tmp_path, tokenizer_dir, max_image_pixels=56 * 56), progress=False)
    assert summary["kept"] == 2 and summary["skipped"] == {"image_too_large": 1}, summary
    section = {"input": "x.jsonl", "tokenizer_name_or_path": "t", "output_prefix": "o"}
    assert build_section(DatasetConfig, section, "dataset").max_image_pixels == 40_000_000
    with pytest.raises(ConfigError, match="max_image_pixels"):
        build_section(DatasetConfig, dict(section, max_image_pixels=200_000_000), "dataset")


def prepared(tmp_path, tokenizer_dir, count=3) -> str:
    """A vision dataset of ``count`` rows, each a different noise picture; returns its prefix."""
    write_rows(tmp_path, {f"p{k}.png": png(56, 56, seed=10 + k) for k in range(count)})
    cfg = config(tmp_path, tokenizer_dir)
    assert preprocess(cfg, progress=False)["kept"] == count
    return cfg.output_prefix


def damage(prefix: str, png_bytes: bytes) -> None:
    """Overwrite the middle of a stored picture's compressed pixels in the .bin (its length unchanged)."""
    path = field_prefix(prefix, "images") + ".bin"
    data = bytearray(open(path, "rb").read())
    at = data.index(png_bytes) + len(png_bytes) // 2
    data[at : at + 64] = b"\xff" * 64
    open(path, "wb").write(bytes(data))


def test_a_picture_damaged_after_preprocessing_skips_its_row_where_it_is_drawn(tmp_path, tokenizer_dir, capsys):
    from mindspeed_rl.datasets.images import ImageEncoder, unpack_images
    from mindspeed_rl.datasets.prompt_dataset import PromptBatch, PromptDataset, PromptSampler, draw_prompts

    prefix = prepared(tmp_path, tokenizer_dir)
    (stored,) = unpack_images(PromptDataset(prefix)[1]["images"])
    damage(prefix, stored)
    dataset = PromptDataset(prefix)
    with pytest.raises(OSError, match="data stream"):  # what stopped the run in a rollout worker
        ImageEncoder().encode(dataset[1]["images"])
    batch = PromptBatch.of(dataset, range(3))
    assert (len(batch.input_ids), batch.skipped, len(batch.images)) == (2, 1, 2)
    assert "data_path" in capsys.readouterr().out  # the damaged row is named once on the console
    sampler = PromptSampler(len(dataset), 2, seed=0, shuffle=False)
    first = draw_prompts(dataset, sampler)  # rows 0 and 2: row 1's place taken by the next position
    assert first.images == [dataset[0]["images"], dataset[2]["images"]] and first.skipped == 1
    assert sampler.consumed_samples == 3
    second = draw_prompts(dataset, sampler)  # epoch 1: rows 0, 1 -> 0, 2
    assert second.skipped == 1 and second.images == first.images
    for row in (0, 2):
        dataset.bad[row] = "image_unreadable"
    from mindspeed_rl.datasets.prompt_dataset import DatasetMissing

    with pytest.raises(DatasetMissing, match="no row's stored images decode"):
        draw_prompts(dataset, sampler)


def test_the_rollout_source_fills_its_batch_past_a_damaged_row_and_counts_it(tmp_path, tokenizer_dir):
    """The trainer's path: RolloutSource.from_config's draw, the batch's rows carrying their prompts' images."""
    from mindspeed_rl.datasets.images import unpack_images
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset, PromptSampler, draw_prompts
    from mindspeed_rl.rollout.source.agent_loop import AgentContext, SingleTurn
    from mindspeed_rl.rollout.source.group_filter import KeepAll
    from mindspeed_rl.rollout.source.rollout_source import RolloutSource
    from mindspeed_rl.rollout.source.schedules import Synchronous
    from tests.rollout_fakes import TOK, ScriptedService, score

    prefix = prepared(tmp_path, tokenizer_dir, count=4)
    (stored,) = unpack_images(PromptDataset(prefix)[1]["images"])
    damage(prefix, stored)
    dataset, sampler = PromptDataset(prefix), PromptSampler(4, 2, seed=0, shuffle=False)
    service = ScriptedService(script=lambda context, seed: "#### red<eos>")
    function, draw = SingleTurn(AgentContext(None, TOK)), lambda: draw_prompts(dataset, sampler)
    source = RolloutSource(service, function, KeepAll(2), Synchronous(8), draw, score, 2, 8, 7, 0, vision=True)
    batch = source.next_batch(0)
    assert batch.metrics["rollout/skipped_prompts"] == 1.0
    assert batch.experience.num_rows == 4 and len(batch.experience.images) == 4 and all(batch.experience.images)
    assert all(request.images and all(request.images) for request in service.requests)
    assert source.next_batch(1).metrics["rollout/skipped_prompts"] == 0.0  # rows 3 and 0


def text_prefix(tmp_path, tokenizer_dir) -> str:
    (tmp_path / "text.jsonl").write_text(json.dumps({"problem": "what colour?", "answer": "red"}) + "\n")
    cfg = DatasetConfig(
        input=str(tmp_path / "text.jsonl"),
        tokenizer_name_or_path=tokenizer_dir,
        output_prefix=str(tmp_path / "out" / "text"),
        prompt_type="empty",
        map_keys={"prompt": "problem", "response": "answer"},
    )
    assert preprocess(cfg, progress=False)["kept"] == 1
    return cfg.output_prefix


def test_images_for_a_text_model_are_refused_before_anything_starts_and_text_for_a_vision_model_is_not(
    tmp_path, tokenizer_dir, capsys
):
    from cli import train_ppo

    images = prepared(tmp_path, tokenizer_dir, count=1)
    run = ["--config-name", "grpo_tiny_cpu", "--check", f"megatron_training.tokenizer_name_or_path={tokenizer_dir}"]
    assert train_ppo.main(run + [f"megatron_training.data_path={images}"]) == 2
    err = capsys.readouterr().err
    assert "megatron_training.data_path" in err and images in err and "holds images" in err, err
    assert "tiny_qwen25 (qwen25) reads text only" in err and "Traceback" not in err, err
    # the reverse is legitimate: a vision-language model trains on text rows (its prompts carry no images)
    import shutil

    from transformers import AutoTokenizer

    from mindspeed_rl.demo.vision_task import save_processor

    vl_tokenizer = tmp_path / "vl_tok"
    shutil.copytree(tokenizer_dir, vl_tokenizer)
    save_processor(str(vl_tokenizer), AutoTokenizer.from_pretrained(tokenizer_dir), 56 * 56, 112 * 112, "qwen2_5_vl")
    text = text_prefix(tmp_path, tokenizer_dir)
    vision_run = [
        "--config-name", "grpo_tiny_cpu_vision", "--check", f"megatron_training.tokenizer_name_or_path={vl_tokenizer}",
        f"megatron_training.data_path={text}", f"megatron_training.test_data_path={text}",
        f"actor_config.load={tmp_path}",
    ]  # fmt: skip
    assert train_ppo.main(vision_run) == 0, capsys.readouterr().err
    assert "check: the config and its paths are valid" in capsys.readouterr().out
