"""Sizes and counts as people read them (the batch plan, the plan lines of the features)."""

from __future__ import annotations


def readable_bytes(count: float) -> str:
    """1.19 TiB, 1.5 GiB, 320 MiB, 12 KiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def readable_count(count: float) -> str:
    """3.4M, 32.8B: three significant digits and a unit."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:g}"
