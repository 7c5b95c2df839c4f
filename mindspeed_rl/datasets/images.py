"""Images of a dataset row: read (a path, raw bytes, or a {"bytes", "path"} record as HF datasets store them in
parquet), fitted to the pixel budget the way Qwen2-VL's image processor fits them, and stored inside the
indexed dataset as PNG bytes.

Inside, not as paths: a preprocessed dataset then moves between machines (an offline node, CI, every rank of a
cluster) whole, a missing or changed image shows up once, at preprocessing, as a skipped row, and rollout and
training read exactly the resized image the token count was computed for. The cost is the PNG bytes of the
resized images (a few hundred KB per image at Qwen2.5-VL's default budget).

Storage of a row's images: for each image, its byte length as 4 little-endian bytes, then its PNG.
"""

from __future__ import annotations

import io
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .dataset_config import MAX_IMAGE_PIXELS


class BadImage(ValueError):
    """A row's image that cannot be used; ``reason`` is the skip reason counted in the summary."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PixelBudget:
    """Qwen2-VL's resizing rule: both sides a multiple of patch x merge, the area within [min, max] pixels,
    the aspect ratio kept as closely as that allows (at most 200:1)."""

    min_pixels: int
    max_pixels: int
    patch: int = 14
    merge: int = 2

    def fit(self, height: int, width: int) -> Tuple[int, int]:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        try:
            return smart_resize(height, width, self.patch * self.merge, self.min_pixels, self.max_pixels)
        except ValueError:
            raise BadImage("image_aspect_ratio") from None

    def tokens(self, height: int, width: int) -> int:
        """Language-model tokens of an image of this (already fitted) size."""
        return (height // self.patch) * (width // self.patch) // self.merge**2


def read_image(value, base_dir: str, max_image_pixels: int = MAX_IMAGE_PIXELS):
    """A PIL image (RGB) from a path (relative to the input file's folder), bytes, or a {"bytes", "path"} record.
    Its size is read from the header first: over ``max_image_pixels`` pixels it is refused undecoded
    (``image_too_large``), so a row's memory is bounded by the limit whatever the file claims."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, str):
        path = value if os.path.isabs(value) else os.path.join(base_dir, value)
        if not os.path.isfile(path):
            raise BadImage("image_missing")
        source = path
    elif isinstance(value, (bytes, bytearray)):
        source = io.BytesIO(value)
    else:
        raise BadImage("image_not_a_path_or_bytes")
    return decoded(source, max_image_pixels)


def decoded(source, max_image_pixels: int):
    """The RGB image of a file or stream whose header gives at most ``max_image_pixels`` pixels (else
    ``image_too_large``, before any decoding); ``image_unreadable`` for one that does not open or decode."""
    import warnings

    from PIL import Image

    with warnings.catch_warnings():  # the limit is ours: Pillow's warning between its two thresholds is not news
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(source)  # the header only
        except Image.DecompressionBombError:
            raise BadImage("image_too_large") from None
        except Exception:  # noqa: BLE001 - a broken file fails in Pillow's plugins in many ways (SyntaxError too)
            raise BadImage("image_unreadable") from None
    with image:
        if image.width * image.height > max_image_pixels:
            raise BadImage("image_too_large")
        try:
            image.load()
            return image.convert("RGB")
        except Exception:  # noqa: BLE001 - truncated data, a broken zlib stream, a bad chunk, ...
            raise BadImage("image_unreadable") from None


def fitted_png(image, budget: PixelBudget) -> Tuple[bytes, int, int]:
    """(PNG bytes, height, width) of ``image`` resized into the budget (bicubic, as the image processor)."""
    from PIL import Image

    height, width = budget.fit(image.height, image.width)
    if (height, width) != (image.height, image.width):
        image = image.resize((width, height), Image.BICUBIC)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue(), height, width


def pack_images(pngs: Sequence[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(png)) + png for png in pngs)


def unpack_images(blob: bytes) -> List[bytes]:
    out, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise ValueError("a row's stored images end inside a length")
        (size,) = struct.unpack_from("<I", blob, at)
        if at + 4 + size > len(blob):
            raise ValueError("a row's stored image runs past the row's bytes")
        out.append(bytes(blob[at + 4 : at + 4 + size]))
        at += 4 + size
    return out


def stored_images_problem(blob: bytes, max_image_pixels: int = MAX_IMAGE_PIXELS) -> Optional[str]:
    """Why a row's stored images cannot be used (a dataset damaged after preprocessing: bytes that do not unpack,
    an image that does not decode or is over ``max_image_pixels``), or None. Decodes every image."""
    try:
        pngs = unpack_images(blob)
    except ValueError:
        return "image_unreadable"
    for png in pngs:
        try:
            decoded(io.BytesIO(png), max_image_pixels)
        except BadImage as exc:
            return exc.reason
    return None


def image_grid(png: bytes, patch: int = 14) -> Tuple[int, int, int]:
    """(t, h, w) patches of a stored image (t = 1)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return 1, image.height // patch, image.width // patch


IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # older / transformers 5 layout


def has_image_processor(folder: Optional[str]) -> bool:
    """Whether a model folder holds its image processor (either file; the Hub's folders have one)."""
    return bool(folder) and any(os.path.isfile(os.path.join(folder, name)) for name in IMAGE_PROCESSOR_FILES)


def image_processor_config(folder: Optional[str]) -> dict:
    """The image processor's settings in a model folder ({} without one)."""
    import json

    for name in IMAGE_PROCESSOR_FILES if folder else ():
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                config = json.load(fh)
            return config.get("image_processor", config)  # processor_config.json nests it
    return {}


def processor_pixel_range(config: dict) -> Tuple[Optional[int], Optional[int]]:
    """An image processor config's own [min, max] pixels (None where it names none)."""
    size = config.get("size") or {}
    return config.get("min_pixels", size.get("shortest_edge")), config.get("max_pixels", size.get("longest_edge"))


def pixel_budget(folder: Optional[str], min_pixels: int, max_pixels: int) -> PixelBudget:
    """The dataset's budget with the patch and merge sizes of ``folder``'s image processor (Qwen2.5-VL's 14 and 2
    without one). A budget outside the processor's own [min, max] pixels is refused: the processor would resize
    the stored images again in vLLM, and the prompt's placeholders would no longer count their tokens."""
    config = image_processor_config(folder)
    low, high = processor_pixel_range(config)
    outside = {"min_pixels": low is not None and min_pixels < low, "max_pixels": high is not None and max_pixels > high}
    for key in (k for k, bad in outside.items() if bad):
        raise ValueError(
            f"{key} {min_pixels if key == 'min_pixels' else max_pixels} lies outside the image processor's "
            f"[{low}, {high}] pixels ({folder}): vLLM would resize the stored images again; keep the dataset's "
            "budget inside the processor's"
        )
    return PixelBudget(min_pixels, max_pixels, int(config.get("patch_size", 14)), int(config.get("merge_size", 2)))


class ImageEncoder:
    """A row's stored images as the vision tower takes them: pixel values [patches, channels x temporal x patch^2]
    and grids [images, 3] (t, h, w in patches), by the model's own image processor (its preprocessor_config.json
    or processor_config.json: the same normalisation vLLM applies), without resizing again: the images were fitted
    to the pixel budget at preprocessing and the prompt's placeholders count their tokens."""

    def __init__(self, model_dir: Optional[str] = None):
        from transformers import AutoImageProcessor, Qwen2VLImageProcessor

        self.processor = (
            AutoImageProcessor.from_pretrained(model_dir) if has_image_processor(model_dir) else Qwen2VLImageProcessor()
        )
        self.patch = int(self.processor.patch_size)
        self._cache: "OrderedDict[bytes, Tuple]" = OrderedDict()

    CACHED = 512  # rows whose encoding is kept: a batch's prompts are encoded for scoring and for the experience

    def encode(self, blob: bytes):
        """(pixel values [P, D] float32, grids [I, 3] long) of one row's images (P = I = 0 for none). The last
        ``CACHED`` rows' encodings are kept (callers copy them into their batches and never write them)."""
        import torch
        from PIL import Image

        blob = bytes(blob)
        if blob in self._cache:
            self._cache.move_to_end(blob)
            return self._cache[blob]
        pngs = unpack_images(blob)
        if not pngs:
            return torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long)
        images = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
        out = self.processor(images=images, do_resize=False, return_tensors="pt")
        encoded = out["pixel_values"].float(), out["image_grid_thw"].long()
        self._cache[blob] = encoded
        if len(self._cache) > self.CACHED:
            self._cache.popitem(last=False)
        return encoded


def as_image_list(value) -> Optional[list]:
    """A row's image field as a list (one image or several); None when it is neither."""
    if value is None:
        return []
    if isinstance(value, (str, bytes, bytearray, dict)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    return None


__all__ = [
    "BadImage",
    "ImageEncoder",
    "PixelBudget",
    "fitted_png",
    "has_image_processor",
    "image_grid",
    "pack_images",
    "read_image",
    "stored_images_problem",
    "unpack_images",
]
