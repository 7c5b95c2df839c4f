"""Which of MindSpeed's switches each pinned MindSpeed release defines.

MindSpeed is not on PyPI (each NPU set clones a branch), so its command-line flags are recorded here from the
source of the branches the sets pin (``requirements/npu.txt``, ``npu-current.txt``), and checked against the
installed release's version (its setup.py version is megatron-core's: 0.12.1, 0.16.0). A flag a release does not
define would be ignored by MindSpeed's adaptor, the switch silently off.

    branch 26.1.0_core_r0.12.1 (57a33053, 2026-07-20) -> version 0.12.1
    branch core_r0.16.0 (e4772499, 2026-07-10)        -> version 0.16.0

``--moe-hierarchical-alltoallv`` was a flag of MindSpeed 2.0.0 (core_r0.8.0); from 2.1.0 on the code still reads
the attribute but no release defines the flag.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Optional

BRANCHES: Dict[str, str] = {"0.12.1": "26.1.0_core_r0.12.1", "0.16.0": "core_r0.16.0"}

_COMMON = frozenset(
    {
        "--recompute-norm",
        "--recompute-norm-num-layers",
        "--recompute-activation-function",
        "--recompute-activation-function-num-layers",
        "--swap-optimizer",
        "--reuse-fp32-param",
        "--swap-attention",
    }
)
FLAGS: Dict[str, FrozenSet[str]] = {"0.12.1": _COMMON, "0.16.0": _COMMON}


def flag_unavailable(flag: str, version: Optional[str]) -> str:
    """Why MindSpeed release ``version`` would not act on ``flag`` ("" when it does, or when the release is not one
    recorded here: nothing is known against it)."""
    if version not in FLAGS or flag in FLAGS[version]:
        return ""
    return f"MindSpeed {version} (branch {BRANCHES[version]}) defines no {flag}: the switch would be ignored"


def installed_version() -> Optional[str]:
    from .stack import installed

    return installed("mindspeed")
