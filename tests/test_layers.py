"""The layer table of docs/architecture.md held against the package's imports (top-level and deferred): one
package a row, and a module imports only its own package and the packages below, so no two folders import each
other. The table is read from the document itself, so the map and the code cannot drift apart. The scripts
beside the package (``cli/``, ``bench/``) hold no import circle among their modules either."""

import ast
import pathlib
import re
import subprocess
import sys
from typing import Dict, List, Set, Tuple

import pytest

from tests.conftest import ROOT

PACKAGE = pathlib.Path(ROOT) / "mindspeed_rl"

# (importing package, imported package) -> why it is allowed. None today: config_cls checks names against
# registries at the floor (algorithm choices, family names) or leaves them to trainer/startup/config_names.py.
ALLOWED: Dict[Tuple[str, str], str] = {}


def layer_table() -> Dict[str, int]:
    """Package folder -> layer, from the table rows ``| <n> <name> | `a/` | ... |`` (the entry points' row names the
    folders outside the package: ``cli/``, ``examples/``)."""
    text = (pathlib.Path(ROOT) / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = {}
    for number, packages in re.findall(r"^\| (\d+) [^|]+\| ([^|]+) \|", text, flags=re.M):
        for name in re.findall(r"`([a-z_]+)/`", packages):
            table[name] = int(number)
    return table


def imports_of(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> List[Tuple[int, str]]:
    """(line, imported mindspeed_rl package) for every import in ``path``, relative ones resolved."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(parts[: len(parts) - node.level])
                names = [".".join(base + ([node.module] if node.module else [a.name])) for a in node.names]
            else:
                names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            dotted = name.split(".")
            if dotted[0] == "mindspeed_rl" and len(dotted) > 1:
                found.append((node.lineno, dotted[1]))
    return found


def violations(table: Dict[str, int], package: pathlib.Path = PACKAGE) -> Dict[Tuple[str, str], List[str]]:
    found: Dict[Tuple[str, str], List[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if len(rel.parts) < 2:
            continue
        own = rel.parts[0]
        for line, imported in imports_of(path, package):
            if imported in table and table[imported] > table[own]:
                found.setdefault((own, imported), []).append(f"mindspeed_rl/{rel}:{line}")
    return found


def test_every_package_has_a_layer_of_its_own():
    table = layer_table()
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(table), f"not in docs/architecture.md's layer table: {sorted(packages - set(table))}"
    shared = {n: sorted(p for p in packages if table[p] == n) for n in {table[p] for p in packages}}
    assert all(len(names) == 1 for names in shared.values()), f"packages sharing a layer: {shared}"
    assert table["config_cls"] == 0 and table["algorithms"] < table["models"] < table["rollout"] < table["trainer"]


def script_circles(folder: str) -> List[List[str]]:
    """Import circles (top-level or deferred) among the modules of a script folder beside the package."""
    from tests.test_budget import modules, runtime_imports

    known = modules(pathlib.Path(ROOT) / folder)
    graph = {m: runtime_imports(m, p, known) for m, p in known.items()}
    reachable = {m: reach(graph, m) for m in graph}
    circles = {tuple(sorted({m} | {n for n in reachable[m] if m in reachable[n]})) for m in graph if m in reachable[m]}
    return sorted(map(list, circles))


def reach(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen: Set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


@pytest.mark.parametrize("folder", ["cli", "bench"])
def test_no_import_circle_among_the_scripts(folder):
    assert script_circles(folder) == []


def test_the_package_never_imports_the_scripts():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            name.split(".")[0] in ("cli", "bench")
            for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
        )
        and not getattr(node, "level", 0)
    ]
    assert not found, f"mindspeed_rl imports cli/ or bench/: {found}"


def test_each_layer_imports_only_its_own_and_the_layers_below():
    found = violations(layer_table())
    unexpected = {pair: where for pair, where in found.items() if pair not in ALLOWED}
    assert not unexpected, "imports from a higher layer:\n" + "\n".join(
        f"{a} -> {b}: {', '.join(where)}" for (a, b), where in sorted(unexpected.items())
    )
    stale = set(ALLOWED) - set(found)
    assert not stale, f"allowed exceptions no longer needed (remove them from ALLOWED): {sorted(stale)}"


def test_the_check_sees_a_deferred_import_from_above(tmp_path):
    package = tmp_path / "mindspeed_rl"
    fake = package / "utils" / "probe.py"
    fake.parent.mkdir(parents=True)
    source = "from . import dist\ndef f():\n    from ..trainer import launch\n    import mindspeed_rl.workers.x\n"
    fake.write_text(source)
    assert imports_of(fake, package) == [(1, "utils"), (3, "trainer"), (4, "workers")]
    assert set(violations(layer_table(), package)) == {("utils", "trainer"), ("utils", "workers")}


def subfolder_arrows(package: pathlib.Path = PACKAGE) -> Dict[str, Dict[str, Set[str]]]:
    """For each package with sub-packages: sub-folder -> the sub-folders it imports ("." stands for the package's own
    modules beside them), over every import, top-level and deferred."""
    found: Dict[str, Dict[str, Set[str]]] = {}
    for top in sorted(p for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        if not any((sub / "__init__.py").exists() for sub in top.iterdir() if sub.is_dir()):
            continue
        arrows: Dict[str, Set[str]] = {}
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(top).parts
            own = rel[0] if len(rel) > 1 else "."
            arrows.setdefault(own, set())
            for name in dotted_imports(path, package):
                parts = name.split(".")
                if parts[:2] != ["mindspeed_rl", top.name] or len(parts) < 3:
                    continue
                sub = parts[2] if (top / parts[2] / "__init__.py").exists() else "."
                if sub != own:
                    arrows[own].add(sub)
        found[top.name] = arrows
    return found


def dotted_imports(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> List[str]:
    """Every mindspeed_rl module or package ``path`` imports from, dotted and absolute (relative ones resolved)."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = list(parts[: len(parts) - node.level]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names += [f"{module}.{a.name}" for a in node.names] if not node.module else [module]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return [n for n in names if n.startswith("mindspeed_rl.")]


def test_no_two_sub_folders_of_a_package_import_each_other():
    """trainer/ and rollout/ are split by job (docs/architecture.md): their sub-folders, and the package's own modules
    beside them, import one another in one direction only."""
    for name, arrows in subfolder_arrows().items():
        circles = sorted(
            {
                tuple(sorted({a} | {b for b in reach(arrows, a) if a in reach(arrows, b)}))
                for a in arrows
                if a in reach(arrows, a)
            }
        )
        assert not circles, f"sub-folders of {name}/ importing each other: {circles}"


def test_the_config_and_the_plan_import_no_torch():
    """A bad config is refused and the plan printed before anything heavy loads (docs/architecture.md): the typed
    config, the features' rules and the plan import without torch."""
    modules = ("mindspeed_rl.config_cls", "mindspeed_rl.features", "mindspeed_rl.trainer.startup.plan")
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + "print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr
