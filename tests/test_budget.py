"""The size budget beside the layer rule (tests/test_layers.py), with an empty allow-list: no module over 400
lines, no function over 80, no import circle among the modules of one layer, that is of one package (deferred
imports count; imports only for type checkers do not), and ``# fmt: skip`` only on tables (a name bound to a
literal tuple, list, set or dict), never to squeeze a call or a message past the formatter."""

import ast
import pathlib
import sys
from typing import Dict, List, Set

from tests.test_layers import PACKAGE, layer_table

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
SOFT_MODULE_LINES = 350  # past this a module names why it is still one module, and what would split it

# module (relative to mindspeed_rl/) -> why it stands over SOFT_MODULE_LINES
LONG_MODULES = {
    "checkpoint/convert.py": "both converter directions with their per-family steps; one module per direction would "
    "split it",
    "models/engine.py": "the megatron-core engine's forward, train step, micro-batching and non-finite guard",
    "rollout/engines/vllm_engine.py": "the vLLM engine: start, generate (whole, or step by step for in-flight "
    "updates),"
    " in-place weight update, routes, quantization",
    "config_cls/rl_config.py": "rl_config's flat keys under MindSpeed-RL's names, each with its bounds and doc",
    "trainer/report/report.py": "the run report's sections (config, plan, curves, final numbers)",
}


def modules(package: pathlib.Path = PACKAGE) -> Dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package (a package by its ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def runtime_imports(
    name: str, path: pathlib.Path, known: Dict[str, pathlib.Path], typing_too: bool = False
) -> Set[str]:
    """The package's modules ``name`` imports when it runs (top-level or deferred; not under TYPE_CHECKING, unless
    ``typing_too``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if not typing_too and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for branch in node.body
        for inner in ast.walk(branch)
    }
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the importing module's package, up level - 1 packages
                module = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
            candidates = submodules if len(submodules) == len(node.names) else [module, *submodules]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def circles(package: pathlib.Path = PACKAGE) -> List[List[str]]:
    """Strongly connected groups (more than one module) of the import graph restricted to one layer."""
    table, known = layer_table(), modules(package)

    def layer(module: str):
        parts = module.split(".")
        return table.get(parts[1]) if len(parts) > 1 else None

    graph = {m: {d for d in runtime_imports(m, p, known) if layer(d) == layer(m)} for m, p in known.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_is_over_the_budget():
    sizes = {str(p): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_a_module_over_the_soft_line_names_its_reason():
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")
    }
    unexplained = {path: n for path, n in sizes.items() if n > SOFT_MODULE_LINES and not LONG_MODULES.get(path)}
    assert not unexplained, f"over {SOFT_MODULE_LINES} lines with no reason in LONG_MODULES: {unexplained}"
    stale = sorted(path for path in LONG_MODULES if sizes.get(path, 0) <= SOFT_MODULE_LINES)
    assert not stale, f"at or under {SOFT_MODULE_LINES} lines now (remove from LONG_MODULES): {stale}"


def test_no_function_is_over_the_budget():
    over = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over[f"{path}:{node.name}"] = length
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def test_no_import_circle_within_a_layer():
    assert circles() == []


def test_no_import_circle_in_config_cls_type_only_imports_included():
    """The config types live apart from the rules (config_cls/run_config.py; the rules are features/'): no module
    names a type of a module that imports it back, not even for the type checker."""
    from tests.test_layers import reach

    known = modules()
    config = {m: p for m, p in known.items() if m.startswith("mindspeed_rl.config_cls")}
    graph = {m: runtime_imports(m, p, known, typing_too=True) & set(config) for m, p in config.items()}
    circular = sorted(m for m in graph if m in reach(graph, m))
    assert not circular, f"config_cls modules in an import circle (type-only imports included): {circular}"


CONFIG_CLS_LINES = 3000  # the typed sections and their assembly; a rule across keys is a feature's (features/)


def test_config_cls_holds_the_types_and_no_rule_across_keys():
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in (PACKAGE / "config_cls").glob("*.py"))
    assert lines <= CONFIG_CLS_LINES, f"config_cls is {lines} lines (at most {CONFIG_CLS_LINES})"


def test_every_feature_module_is_in_the_loop_and_speaks_its_protocol():
    """A module of features/ is run by the loops (FEATURES) and defines at least one of their functions; the loops,
    the loaders and the stages' rules are the package's own."""
    from mindspeed_rl.features import loop

    listed = {m.__name__.rsplit(".", 1)[1] for m in loop.FEATURES}
    own = {"__init__", "loop", "load", "stages"}
    found = {p.stem for p in (PACKAGE / "features").glob("*.py")} - own
    assert found == listed, f"features/ modules not in FEATURES: {sorted(found - listed)}"
    protocol = ("derive", "check_role", "check", "plan_lines", "preflight")
    silent = [m.__name__ for m in loop.FEATURES if not any(hasattr(m, name) for name in protocol)]
    assert not silent, f"feature modules defining none of {protocol}: {silent}"


def test_fmt_skip_only_on_tables():
    misused = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "# fmt: skip" not in text:
            continue
        tables = {
            node.end_lineno
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, (ast.Tuple, ast.List, ast.Set, ast.Dict))
        }
        for number, line in enumerate(text.splitlines(), 1):
            if line.rstrip().endswith("# fmt: skip") and number not in tables:
                misused.append(f"{path}:{number}")
    assert not misused, f"# fmt: skip outside a table: {misused}"


def test_the_checks_find_what_they_look_for(tmp_path):
    """The circle finder and the budget rules on a package made to break them."""
    package = tmp_path / "mindspeed_rl"
    (package / "utils").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "utils" / "__init__.py").write_text("")
    (package / "utils" / "a.py").write_text("def f():\n    from .b import g\n")
    (package / "utils" / "b.py").write_text("from .a import f\n")
    (package / "utils" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n"
    )
    assert circles(package) == [["mindspeed_rl.utils.a", "mindspeed_rl.utils.b"]]
