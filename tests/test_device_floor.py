"""The device floor: outside mindspeed_rl/accelerator/ no code compares a device kind or calls
torch.cuda / torch.npu; every device decision is an Accelerator method."""

import ast
import pathlib
from typing import Iterator, List

from tests.conftest import ROOT
from tests.helpers import source_files

KINDS = {"cpu", "cuda", "npu"}
DEVICE_MODULES = {"cuda", "npu"}
ACCELERATOR = pathlib.Path(ROOT) / "mindspeed_rl" / "accelerator"


def _is_kind(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in KINDS


def _kinds_in(node: ast.AST) -> bool:
    """A kind name itself, or one inside a literal tuple/list/set (``x in ("cuda", "npu")``)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_kind(e) for e in node.elts)
    return _is_kind(node)


def _device_module(name: str) -> bool:
    """torch_npu, torch.cuda, torch.npu or a submodule of those."""
    return name == "torch_npu" or any(name.split(".")[:2] == ["torch", m] for m in DEVICE_MODULES)


def device_code(source: str, filename: str = "<snippet>") -> List[str]:
    """``file:line: what`` for each device-kind comparison and torch.cuda / torch.npu use in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        what = None
        if isinstance(node, ast.Compare):
            if any(_kinds_in(side) for side in [node.left, *node.comparators]):
                what = "compares a device kind"
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in DEVICE_MODULES
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
        ):
            what = f"torch.{node.attr}"
        elif isinstance(node, ast.Import) and any(_device_module(a.name) for a in node.names):
            what = "imports a device module"
        elif isinstance(node, ast.ImportFrom) and (
            _device_module(node.module or "")
            or node.module == "torch"
            and any(a.name in DEVICE_MODULES for a in node.names)
        ):
            what = "imports a device module"
        if what:
            found.append((node.lineno, f"{filename}:{node.lineno}: {what}"))
    return [text for _, text in sorted(found)]


def checked_files() -> Iterator[pathlib.Path]:
    return source_files(("mindspeed_rl", "cli"), outside=ACCELERATOR)


def test_no_device_code_outside_the_accelerator():
    found = []
    for path in checked_files():
        found += device_code(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, "device decisions belong in mindspeed_rl/accelerator/:\n" + "\n".join(found)


def test_the_detector_flags_device_code():
    files = list(checked_files())
    assert any(p.name == "launch.py" for p in files) and any(p.parent.name == "cli" for p in files)
    assert not any(p.parent == ACCELERATOR for p in files)
    snippet = "\n".join(
        [
            'if acc.kind == "cpu": pass',
            "torch.cuda.synchronize()",
            'ok = kind in ("cuda", "npu")',
            'ok = "npu" != kind',
            "state = torch.npu.get_rng_state()",
            'ok = kind not in ["cpu"]',
            'ok = kind == "embedding" and mode in ("kl", "abs")',
            'x = torch.device("cpu")',
            "from torch import cuda",
            "import torch_npu",
        ]
    )
    assert device_code(snippet, "s.py") == [
        "s.py:1: compares a device kind",
        "s.py:2: torch.cuda",
        "s.py:3: compares a device kind",
        "s.py:4: compares a device kind",
        "s.py:5: torch.npu",
        "s.py:6: compares a device kind",
        "s.py:9: imports a device module",
        "s.py:10: imports a device module",
    ]
