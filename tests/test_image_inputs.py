"""Hostile images at preprocessing: decompression bombs and broken files are skipped and counted, never a
traceback, and an image over max_image_pixels is refused from its header before any decoding."""

import io
import json
import random
import struct
import zlib

import pytest
from PIL import Image

from mindspeed_rl.config_cls.dataset_config import DatasetConfig
from mindspeed_rl.datasets.preprocess import preprocess
from mindspeed_rl.demo.tiny_hf import build_tokenizer

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


def config(tmp_path, tokenizer_dir, **overrides) -> DatasetConfig:
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
