"""The files of a preprocessed dataset: one megatron indexed dataset (``.bin`` and ``.idx``) per field, named from
the output prefix. Light (no torch): the config checks read it before anything heavy is imported."""

from __future__ import annotations

import os


def field_prefix(output_prefix: str, field: str) -> str:
    return f"{output_prefix}_packed_{field}_document"


def holds_images(prefix: str) -> bool:
    """Whether a preprocessed dataset has an ``images`` field (R1VisionInstructionHandler wrote it)."""
    return os.path.isfile(field_prefix(prefix, "images") + ".idx")
