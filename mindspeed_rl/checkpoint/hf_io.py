"""HF model folders on disk: reading their tensors, config.json and tokenizer, writing safetensors shards
with their index, config.json and the tokenizer files. The converters (``convert.py``) go through here.

Tensors are read lazily (safetensors ``safe_open`` per read, or ``torch.load(mmap=True)`` for .bin) and
written in shards as they fill, so no whole model is held in host memory.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..config_cls.base import ConfigError
from ..config_cls.model_config import ModelConfig
from ..families import FamilyError, resolve_family
from .errors import ConversionError
from .shape_check import check_hf_sizes

# the tokenizer's files and a vision-language model's processor (image and video processors, chat template):
# what transformers and vLLM read beside config.json
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)


class HFReader:
    """Lazy access to the tensors of a HF model folder (sharded or not, safetensors or .bin)."""

    def __init__(self, folder: str):
        self.folder = folder
        self._handles: Dict[str, object] = {}
        self.weight_map = self._weight_map()

    def _weight_map(self) -> Dict[str, str]:
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            path = os.path.join(self.folder, index)
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as fh:
                    return json.load(fh)["weight_map"]
        for single in ("model.safetensors", "pytorch_model.bin"):
            path = os.path.join(self.folder, single)
            if os.path.isfile(path):
                return {name: single for name in self._open(single).keys()}
        raise ConversionError(f"{self.folder}: no model.safetensors(.index.json) or pytorch_model.bin(.index.json)")

    def _open(self, filename: str):
        if filename.endswith(".safetensors"):  # opened per read: no mapping (and RSS) kept alive
            path = os.path.join(self.folder, filename)
            if not os.path.isfile(path):
                raise ConversionError(f"{path}: named by the index but missing")
            from safetensors import SafetensorError, safe_open

            try:
                return safe_open(path, framework="pt")
            except (SafetensorError, OSError) as exc:
                raise ConversionError(f"{path}: not a readable safetensors file ({exc})") from None
        if filename not in self._handles:
            path = os.path.join(self.folder, filename)
            if not os.path.isfile(path):
                raise ConversionError(f"{path}: named by the index but missing")
            try:
                self._handles[filename] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:  # noqa: BLE001 - pickle, zip and mmap failures all mean a broken file
                raise ConversionError(f"{path}: not a readable checkpoint file ({str(exc).splitlines()[0]})") from None
        return self._handles[filename]

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise ConversionError(f"{self.folder}: tensor {name!r} not found")
        filename = self.weight_map[name]
        if filename.endswith(".safetensors"):
            from safetensors import SafetensorError

            try:
                with self._open(filename) as handle:
                    return handle.get_tensor(name)
            except SafetensorError as exc:
                raise ConversionError(
                    f"{os.path.join(self.folder, filename)}: cannot read {name!r} (truncated or corrupt: {exc})"
                ) from None
        return self._open(filename)[name]

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        """Every tensor's shape, from the files' headers (a .bin file is memory-mapped): no weight is read."""
        by_file: Dict[str, List[str]] = {}
        for name, filename in self.weight_map.items():
            by_file.setdefault(filename, []).append(name)
        shapes: Dict[str, Tuple[int, ...]] = {}
        for filename, names in by_file.items():
            path = os.path.join(self.folder, filename)
            try:
                if filename.endswith(".safetensors"):
                    with self._open(filename) as handle:
                        shapes.update((name, tuple(handle.get_slice(name).get_shape())) for name in names)
                else:
                    tensors = self._open(filename)
                    shapes.update((name, tuple(tensors[name].shape)) for name in names)
            except ConversionError:
                raise
            except Exception as exc:  # noqa: BLE001 - a name the index gives that the file lacks, a corrupt header
                raise ConversionError(f"{path}: cannot read the tensors the index names ({exc})") from None
        return shapes


def read_hf_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{folder}: no config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConversionError(f"{path}: expected a JSON object of model settings")
    return config


def read_hf_model_config(load_dir: str, model_type_hf: Optional[str] = None) -> ModelConfig:
    """The model section of a HF folder: its family from config.json (``model_type_hf``, when given, must
    agree), then the family's reading of the config."""
    path = os.path.join(load_dir, "config.json")
    hf = read_hf_config(load_dir)
    try:
        family = resolve_family(hf, model_type_hf, path)
        check_hf_sizes(hf, family, path)
        return family.model_config_from_hf(hf)
    except KeyError as exc:
        raise ConversionError(f"{path}: lacks {exc.args[0]!r}") from None
    except ConfigError as exc:
        raise ConversionError(f"{path}: {exc}") from None
    except (FamilyError, TypeError, ValueError, ArithmeticError) as exc:
        raise ConversionError(str(exc) if str(exc).startswith(("--", path)) else f"{path}: {exc}") from None


def special_token_ids(tokenizer_dir: Optional[str]) -> Tuple[int, int]:
    """(eos, pad) ids of the tokenizer in ``tokenizer_dir``; 0 where it has none."""
    if not tokenizer_dir or not os.path.isdir(tokenizer_dir):
        return 0, 0
    from ..utils.hf_tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir, "megatron_training.tokenizer_name_or_path")
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    return eos, tok.pad_token_id if tok.pad_token_id is not None else eos


class SafetensorsShardWriter:
    """Writes HF tensors into numbered safetensors shards of at most ``max_bytes`` each + an index."""

    def __init__(self, folder: str, max_bytes: int):
        self.folder, self.max_bytes = folder, max_bytes
        self.pending: Dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: List[Tuple[str, List[str]]] = []
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_bytes:
            self.flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total += size

    def flush(self) -> None:
        if not self.pending:
            return
        from safetensors.torch import save_file

        tmp = f"shard-{len(self.files):05d}.tmp"
        save_file(self.pending, os.path.join(self.folder, tmp), metadata={"format": "pt"})
        self.files.append((tmp, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        self.flush()
        n = len(self.files)
        if n == 1:
            os.replace(os.path.join(self.folder, self.files[0][0]), os.path.join(self.folder, "model.safetensors"))
            return
        weight_map = {}
        for i, (tmp, names) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(os.path.join(self.folder, tmp), os.path.join(self.folder, final))
            weight_map.update({name: final for name in names})
        with open(os.path.join(self.folder, "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
            json.dump({"metadata": {"total_size": self.total}, "weight_map": weight_map}, fh, indent=2)


def write_config_and_tokenizer(folder: str, hf_config: dict, tokenizer_dir: Optional[str]) -> None:
    """``hf_config`` as ``<folder>/config.json`` and the tokenizer files found in ``tokenizer_dir`` beside it."""
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(hf_config, fh, indent=2)
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        src = os.path.join(tokenizer_dir, name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(folder, name))


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def dequantize_fp8_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: Sequence[int]) -> torch.Tensor:
    """A block-quantized FP8 weight in fp32 (DeepSeek-V3's Hub format: ``weight_scale_inv`` holds one factor per
    ``block`` tile of the weight, the last tiles cut at the edges): w[i, j] = q[i, j] * s[i // b0, j // b1]."""
    rows, cols = weight.shape
    scale = scale_inv.float().repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return weight.float() * scale
