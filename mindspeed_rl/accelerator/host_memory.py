"""The host's allocator on a CPU device: freed memory kept for reuse, as a GPU's caching allocator keeps it."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

# glibc's mallopt parameters, and the values a CPU worker sets (mallopt takes an int; a trim threshold of -1: never)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
HOST_ALLOCATOR = ((M_MMAP_THRESHOLD, 1 << 30), (M_TRIM_THRESHOLD, -1), (M_TOP_PAD, 64 << 20))
GLIBC_MMAP_THRESHOLD_CAP = 32 << 20  # glibc before 2.35 refuses a larger mmap threshold


def keep_freed_host_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse, as a GPU's caching allocator does. By default it serves a
    block above its mmap threshold (32 MiB at most) with fresh pages and unmaps them when freed, and gives the top
    of its heap back past 128 KiB, so the large activations and gradients of every step fault their pages in again
    (the ``wide`` bench shape's MLP output: 89 MB, 22k faults; 0.5-0.9M faults per actor step): blocks up to 1 GiB
    now come from the heap, which is never trimmed. The process keeps its peak (the wide shape's actor: 8.5 GB
    against 8.3 GB) and steps without faults (docs/performance.md). glibc before 2.35 caps the threshold at 32 MiB:
    there the blocks above it are still mapped anew. Nothing where the user tunes malloc (MALLOC_*_ or
    GLIBC_TUNABLES) or the C library has no mallopt; returns whether every setting took."""
    import ctypes

    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "") or any(
        k.startswith("MALLOC_") and k.endswith("_") for k in os.environ
    ):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    taken = [mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1 for param, value in HOST_ALLOCATOR]
    if not taken[0]:
        mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(GLIBC_MMAP_THRESHOLD_CAP))
        log.info("host allocator: glibc refuses an mmap threshold of 1 GiB; 32 MiB, the heap never trimmed")
    return all(taken)
