"""Prompts for training: the indexed files, a seeded epoch-wise sampler that resumes exactly, and the batch of
prompts one draw gives."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .padding import left_pad
from .preprocess import field_prefix


class DatasetMissing(FileNotFoundError):
    """The preprocessed files named by data_path (or test_data_path) are not there."""


def bytes_needed(index, row: int) -> int:
    """How long the .bin must be for ``row`` of an indexed dataset's index to be read."""
    return int(index.sequence_pointers[row]) + int(index.sequence_lengths[row]) * index.dtype_size


def open_indexed(prefix: str):
    """An IndexedDataset whose .idx parses and whose .bin holds every byte the index points at."""
    import sys

    from megatron.core.datasets.indexed_dataset import IndexedDataset

    problem = None
    hook, sys.unraisablehook = sys.unraisablehook, lambda _: None  # a half-built dataset's __del__ complains
    try:
        dataset = IndexedDataset(prefix, mmap=True)
    except Exception as exc:  # noqa: BLE001 - a damaged index fails in struct/numpy/assert in many ways
        problem = f"{type(exc).__name__}: {exc}"
    finally:
        sys.unraisablehook = hook
    if problem is not None:
        raise DatasetMissing(f"{prefix}.idx is truncated or corrupt ({problem}); rerun cli/preprocess_data.py")
    index = dataset.index
    if len(index.sequence_lengths):
        needed = bytes_needed(index, -1)
        have = os.path.getsize(prefix + ".bin")
        if have < needed:
            raise DatasetMissing(
                f"{prefix}.bin is truncated ({have} bytes; its index needs {needed}); rerun cli/preprocess_data.py"
            )
    return dataset


class PromptDataset:
    """Prompt token ids and text fields (labels, ...) of one preprocessed dataset; with ``token_fields`` more
    token-id fields (preference pairs: ``chosen_ids``, ``rejected_ids``).

    Prompts longer than ``max_prompt_length`` tokens, and rows whose prompt and longest token field together
    are longer than ``max_length``, are left out (their count is in ``dropped``). A vision dataset's ``images``
    field is read whenever the files hold one, as the bytes datasets/images.py stored; ``unusable`` decodes a
    row's images (once a run) so that a row damaged after preprocessing is skipped where it is drawn.
    """

    BINARY_FIELDS = ("images",)
    SHOW_FIRST = 5  # skipped rows named on the console; the others are only counted

    def __init__(
        self,
        output_prefix: str,
        additional_keys: Sequence[str] = ("labels",),
        max_prompt_length: Optional[int] = None,
        key: str = "data_path",
        token_fields: Sequence[str] = (),
        max_length: Optional[int] = None,
    ):
        self.prefix, self.key = output_prefix, key
        self.token_fields = ("input_ids", *token_fields)
        fields = {name: field_prefix(output_prefix, name) for name in self.token_fields}
        fields.update({k: field_prefix(output_prefix, k) for k in additional_keys})
        for name in self.BINARY_FIELDS:
            if os.path.isfile(field_prefix(output_prefix, name) + ".idx"):
                fields.setdefault(name, field_prefix(output_prefix, name))
        for name, prefix in fields.items():
            if not os.path.isfile(prefix + ".bin") or not os.path.isfile(prefix + ".idx"):
                raise DatasetMissing(
                    f"{key} {output_prefix}: {prefix}.bin/.idx not found (run cli/preprocess_data.py to make them)"
                )
        self.fields = {name: open_indexed(prefix) for name, prefix in fields.items()}
        # the .bin files as memory-mapped: one truncated under a running job would end it with SIGBUS on the
        # next read, so each read first checks the file (the same inode as the mapping) still holds its bytes
        self.bins = {name: os.open(prefix + ".bin", os.O_RDONLY) for name, prefix in fields.items()}
        self.bin_paths = {name: prefix + ".bin" for name, prefix in fields.items()}
        lengths = np.asarray(self.fields["input_ids"].sequence_lengths)
        keep = np.ones(len(lengths), dtype=bool) if max_prompt_length is None else lengths <= max_prompt_length
        if max_length is not None:
            longest = lengths + np.max([self.fields[f].sequence_lengths for f in token_fields] or [0 * lengths], axis=0)
            keep &= longest <= max_length
        self.indices = np.nonzero(keep & (lengths > 0))[0]
        self.dropped = int(len(lengths) - len(self.indices))
        # a vision dataset's rows whose images were decoded, and those that did not decode, with the reason
        self.checked = np.zeros(len(lengths), dtype=bool) if "images" in self.fields else None
        self.bad: Dict[int, str] = {}
        if len(self.indices) == 0:
            limit = f"max_prompt_length {max_prompt_length}" if max_length is None else f"max length {max_length}"
            raise DatasetMissing(f"{key} {output_prefix}: no row fits {limit}")

    def __len__(self) -> int:
        return len(self.indices)

    def _check_bin(self, name: str, row: int) -> None:
        needed = bytes_needed(self.fields[name].index, row)
        have = os.fstat(self.bins[name]).st_size
        if have < needed:
            raise DatasetMissing(
                f"{self.bin_paths[name]} was truncated while the run read it ({have} bytes; row "
                f"{row} needs {needed}): rerun cli/preprocess_data.py, then resume"
            )

    def __getitem__(self, i: int) -> Dict:
        row = int(self.indices[i])
        for name in self.fields:
            self._check_bin(name, row)
        item: Dict = {"index": row}
        for name, ds in self.fields.items():
            if name in self.token_fields:
                item[name] = ds[row].astype(np.int64).tolist()
            elif name in self.BINARY_FIELDS:
                item[name] = ds[row].tobytes()
            else:
                item[name] = ds[row].tobytes().decode("utf-8")
        return item

    def unusable(self, i: int) -> Optional[str]:
        """Why prompt ``i`` cannot be used (its stored images do not decode: datasets/images.py's reason), or
        None. A row's images are decoded the first time it is asked about (a bad row is named on the console)."""
        if self.checked is None:
            return None
        from .images import stored_images_problem

        row = int(self.indices[i])
        if not self.checked[row]:
            self._check_bin("images", row)
            why = stored_images_problem(self.fields["images"][row].tobytes())
            self.checked[row] = True
            if why is not None:
                self.bad[row] = why
                if len(self.bad) <= self.SHOW_FIRST:
                    print(f"{self.key} {self.prefix}: row {row} skipped: its stored images do not decode ({why})")
        return self.bad.get(row)

    def all_unusable(self) -> bool:
        return len(self.bad) == len(self.indices)

    def __del__(self) -> None:
        for fd in getattr(self, "bins", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass


class PromptSampler:
    """Global batches of dataset positions, epoch after epoch, from a consumed-samples counter.

    Epoch e visits every prompt once, in the order ``permutation(seed + e)`` (or file order with
    ``shuffle=False``). The state is just ``consumed_samples``: restoring it gives exactly the
    batches an uninterrupted run would have seen next.
    """

    def __init__(self, size: int, global_batch_size: int, seed: int, shuffle: bool = True, consumed_samples: int = 0):
        if size < 1 or global_batch_size < 1:
            raise ValueError("size and global_batch_size must be >= 1")
        self.size, self.global_batch_size = size, global_batch_size
        self.seed, self.shuffle = seed, shuffle
        self.consumed_samples = consumed_samples
        self._orders: Dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) > 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = (
                np.random.RandomState(self.seed + epoch).permutation(self.size)
                if self.shuffle
                else np.arange(self.size)
            )
        return self._orders[epoch]

    def position(self, k: int) -> int:
        return int(self._order(k // self.size)[k % self.size])

    @property
    def epoch(self) -> int:
        return self.consumed_samples // self.size

    def next_batch(self) -> List[int]:
        return self.next_positions(self.global_batch_size)

    def next_positions(self, count: int) -> List[int]:
        start = self.consumed_samples
        positions = [self.position(k) for k in range(start, start + count)]
        self.consumed_samples += count
        return positions

    def state_dict(self) -> Dict:
        return {"consumed_samples": self.consumed_samples, "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: Dict) -> None:
        self.consumed_samples = int(state["consumed_samples"])


@dataclass
class PromptBatch:
    """Token ids of each prompt and its label (the reference answer the verifiers compare against)."""

    input_ids: List[List[int]]
    labels: List[str]
    max_new_tokens: Optional[List[int]] = None  # per-prompt response budgets (dataset key max_new_tokens)
    tools: Optional[List[Optional[List[str]]]] = None  # per-prompt tool names (dataset key tools); None: all
    images: Optional[List[bytes]] = None  # per-prompt images as stored (datasets/images.py; b"" for none)
    skipped: int = 0  # rows of the draw left out: their stored images do not decode

    @staticmethod
    def of(dataset, indices) -> "PromptBatch":
        """The prompts (labels, and budgets, tools, images when the dataset has those keys) of rows
        ``indices`` of a PromptDataset; rows whose stored images do not decode are left out (``skipped``)."""
        unusable = getattr(dataset, "unusable", None)  # (a list of rows stands in for a dataset in tests)
        indices = list(indices)
        items = [dataset[i] for i in indices if unusable is None or unusable(i) is None]
        has = set(items[0]) if items else set(getattr(dataset, "fields", ()))
        budgets = [int(it["max_new_tokens"]) for it in items] if "max_new_tokens" in has else None
        tools = [json.loads(it["tools"]) for it in items] if "tools" in has else None
        images = [it["images"] for it in items] if "images" in has else None
        ids, labels = [list(it["input_ids"]) for it in items], [it.get("labels", "") for it in items]
        return PromptBatch(ids, labels, budgets, tools, images, len(indices) - len(items))

    def __add__(self, other: "PromptBatch") -> "PromptBatch":
        def cat(a, b):
            return None if a is None or b is None else a + b

        return PromptBatch(
            self.input_ids + other.input_ids,
            self.labels + other.labels,
            cat(self.max_new_tokens, other.max_new_tokens),
            cat(self.tools, other.tools),
            cat(self.images, other.images),
            self.skipped + other.skipped,
        )


def draw_prompts(dataset, sampler) -> PromptBatch:
    """The sampler's next global batch of ``dataset``'s prompts, whole: each row left out (its stored images do not
    decode) is counted in ``skipped`` and the sampler's next position takes its place."""
    positions = sampler.next_batch()
    batch = PromptBatch.of(dataset, positions)
    while len(batch.input_ids) < len(positions):  # (only a vision dataset leaves rows out)
        if dataset.all_unusable():
            raise DatasetMissing(
                f"{dataset.key} {dataset.prefix}: no row's stored images decode; rerun cli/preprocess_data.py"
            )
        more = sampler.next_positions(len(positions) - len(batch.input_ids))
        batch = batch + PromptBatch.of(dataset, more)
    return batch


def collate_prompts(items: Sequence[Dict], pad_id: int) -> Dict:
    """Left-padded prompt batch plus the text columns."""
    ids, mask = left_pad([it["input_ids"] for it in items], pad_id)
    batch = {"input_ids": ids, "attention_mask": mask}
    for key in items[0]:
        if key not in ("input_ids",):
            batch[key] = [it[key] for it in items]
    return batch
