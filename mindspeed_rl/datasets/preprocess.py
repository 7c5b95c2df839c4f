"""Rows -> handler -> Megatron indexed datasets, with workers, progress and a skip summary.

Output per field: ``<output_prefix>_packed_<field>_document.{bin,idx}`` (megatron-core's
indexed dataset, memory-mapped): the handler's token fields (``input_ids``; preference pairs also
``chosen_ids`` and ``rejected_ids``) as int32 token ids, text fields (``labels`` and other additional
keys) as UTF-8 bytes, binary fields (a vision row's ``images``, datasets/images.py) as they are. Files are
written under temporary names and renamed at the end, so an interrupted run leaves no files that look
complete. A summary ``<output_prefix>_summary.json`` holds {"read", "kept", "skipped": {reason: count}}.
"""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing as mp
import os
import time
from collections import Counter
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import torch
from tqdm import tqdm

from ..utils.hf_tokenizer import load_tokenizer
from .dataset_config import DatasetConfig
from .handlers import HANDLERS
from .indexed_files import field_prefix
from .readers import BadEncoding, iter_rows

log = logging.getLogger(__name__)
CHUNK = 256
SHOW_FIRST = 5
_WORKER = {}


def _init_worker(cfg: DatasetConfig, tools: Mapping[str, Any], tokenizer=None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg.tokenizer_name_or_path, "tokenizer_name_or_path")
    _WORKER["handler"] = HANDLERS[cfg.handler_name](cfg, tokenizer, tools)


def _process_chunk(chunk: List[Tuple[str, object]]):
    handler = _WORKER["handler"]
    out = []
    for where, payload in chunk:
        if isinstance(payload, BadEncoding):
            out.append((where, None, "bad_encoding"))
            continue
        if isinstance(payload, str):
            try:
                payload = json.loads(payload)
            except json.JSONDecodeError:
                out.append((where, None, "malformed_json"))
                continue
        sample, reason = handler.process(payload)
        out.append((where, sample, reason))
    return out


class IndexedWriter:
    """One megatron IndexedDatasetBuilder per field, finalised and renamed at the end."""

    def __init__(self, output_prefix: str, fields: Iterable[str], token_fields: Iterable[str] = ("input_ids",)):
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        self.prefix = output_prefix
        self.token_fields = set(token_fields)  # int32 token ids; the other fields UTF-8 text
        self.builders = {}
        for field in fields:
            dtype = np.int32 if field in self.token_fields else np.uint8
            self.builders[field] = IndexedDatasetBuilder(field_prefix(output_prefix, field) + ".bin.part", dtype=dtype)

    def add(self, sample: Dict) -> None:
        for field, builder in self.builders.items():
            value = sample[field]
            if field in self.token_fields:
                builder.add_item(torch.tensor(value, dtype=torch.int32))
            else:  # text as UTF-8, binary fields (images) as they are
                data = value if isinstance(value, (bytes, bytearray)) else value.encode("utf-8")
                builder.add_item(
                    torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
                )
            builder.end_document()

    def finish(self) -> None:
        for field, builder in self.builders.items():
            base = field_prefix(self.prefix, field)
            builder.finalize(base + ".idx.part")
        for field in self.builders:
            base = field_prefix(self.prefix, field)
            os.replace(base + ".bin.part", base + ".bin")
            os.replace(base + ".idx.part", base + ".idx")

    def abandon(self) -> None:
        for field in self.builders:
            for ext in (".bin.part", ".idx.part"):
                path = field_prefix(self.prefix, field) + ext
                if os.path.exists(path):
                    os.remove(path)


def _chunks(rows, size: int):
    it = iter(rows)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk


def preprocess(cfg: DatasetConfig, progress: bool = True, tools: Optional[Mapping[str, Any]] = None) -> Dict:
    """Run the preprocessing; returns the summary dict (also written next to the output). ``tools``: name ->
    ToolSpec of the tools the prompts list (``trainer.config_names.check_dataset_names`` resolves them)."""
    tools = dict(tools or {})
    out_dir = os.path.dirname(os.path.abspath(cfg.output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    rows = iter_rows(cfg.input)
    first = next(rows, None)  # surfaces a bad input path before workers start
    if first is not None:
        rows = itertools.chain([first], rows)
    tokenizer = load_tokenizer(cfg.tokenizer_name_or_path, "tokenizer_name_or_path")  # a bad one before workers
    handler = HANDLERS[cfg.handler_name]
    fields = [*handler.token_fields, *handler.binary_fields, *cfg.dataset_additional_keys]
    writer = IndexedWriter(cfg.output_prefix, fields, handler.token_fields)
    read, kept, skipped, examples = 0, 0, Counter(), []
    start = time.perf_counter()
    bar = tqdm(desc=f"preprocess {os.path.basename(cfg.output_prefix)}", unit="row", disable=not progress)
    pool = None
    try:
        if cfg.workers > 1:
            # fork (Linux) starts workers in milliseconds; spawn elsewhere
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            pool = mp.get_context(method).Pool(cfg.workers, initializer=_init_worker, initargs=(cfg, tools))
            results = pool.imap(_process_chunk, _chunks(rows, CHUNK))
        else:
            _init_worker(cfg, tools, tokenizer)
            results = map(_process_chunk, _chunks(rows, CHUNK))
        next_log = cfg.log_interval
        for chunk in results:
            for where, sample, reason in chunk:
                read += 1
                if sample is None:
                    skipped[reason] += 1
                    if len(examples) < SHOW_FIRST:
                        examples.append(f"{where}: {reason}")
                else:
                    writer.add(sample)
                    kept += 1
            bar.update(len(chunk))
            if read >= next_log:
                log.info("%d rows read, %d kept, %.0f rows/s", read, kept, read / (time.perf_counter() - start))
                next_log += cfg.log_interval
    except BaseException:
        writer.abandon()
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()
    summary = {"read": read, "kept": kept, "skipped": dict(sorted(skipped.items()))}
    if kept:
        writer.finish()
        with open(cfg.output_prefix + "_summary.json.part", "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
        os.replace(cfg.output_prefix + "_summary.json.part", cfg.output_prefix + "_summary.json")
    else:  # nothing kept: the outputs of an earlier run (data and summary) stay as they were, together
        writer.abandon()
    summary["examples"] = examples
    summary["seconds"] = time.perf_counter() - start
    return summary
