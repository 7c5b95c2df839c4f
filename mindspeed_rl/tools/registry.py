"""Tool specs: the name the model calls, the JSON schema shown to it, and the function that runs it.

A tool is a Python function of keyword arguments returning a string (anything else is JSON-encoded). It
runs in the sandbox's child process (``sandbox.py``), found there by its dotted path ``module:function``.
Register one with the ``tool`` decorator and name it in the config by that path::

    from mindspeed_rl.tools import tool

    @tool(description="Look a word up.", parameters={"type": "object",
          "properties": {"word": {"type": "string"}}, "required": ["word"]})
    def lookup(word: str) -> str: ...

    rl_config: {tools: [calculator, my_pkg.my_tools:lookup]}

or describe it in a tool config file (``rl_config.tool_config_path``)::

    tools:
      - name: lookup
        function: my_pkg.my_tools:lookup
        description: Look a word up.
        parameters: {type: object, properties: {word: {type: string}}, required: [word]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from ..utils.plugins import PluginImportError, import_callable, split_path


class ToolConfigError(ValueError):
    """A tool entry that does not resolve (unknown name, function not importable, schema missing)."""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    function: str  # "module:function", imported in the sandbox
    description: str
    parameters: Dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    # whether the model's arguments can make the tool run code of the model's choosing; such tools need the
    # isolation of rl_config.sandbox.isolation (isolation.py). Only a tool known not to (the calculator) says False.
    runs_model_code: bool = True

    def schema(self) -> Dict[str, Any]:
        """The OpenAI / hermes function schema the chat template lists."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def missing_arguments(self, arguments: Dict[str, Any]) -> list:
        return [k for k in self.parameters.get("required", []) if k not in arguments]


def tool(
    description: str,
    parameters: Optional[Dict[str, Any]] = None,
    name: Optional[str] = None,
    runs_model_code: bool = True,
) -> Callable:
    """Mark a function as a tool: its spec is read from the function when the config names its path.
    ``runs_model_code=False`` declares that no argument can make it run code of the model's choosing, so it may
    run where bubblewrap cannot (it is isolated like any tool where bubblewrap runs)."""

    def mark(fn: Callable) -> Callable:
        fn.tool_spec = dict(
            name=name or fn.__name__,
            description=description,
            parameters=parameters or {"type": "object", "properties": {}},
            runs_model_code=runs_model_code,
        )
        return fn

    return mark


BUILTIN_TOOLS: Dict[str, ToolSpec] = {
    "calculator": ToolSpec(
        "calculator",
        "mindspeed_rl.tools.builtin:calculator",
        "Evaluate an arithmetic expression exactly: integers and decimals, + - * / // % ** and parentheses.",
        {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 37 * 91"}},
            "required": ["expression"],
        },
        runs_model_code=False,
    ),
    "python": ToolSpec(
        "python",
        "mindspeed_rl.tools.builtin:python",
        "Run a Python program and return what it prints (no network, no files outside a scratch folder, no "
        "other processes).",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program"}},
            "required": ["code"],
        },
    ),
}


def model_code_tools(specs: Dict[str, ToolSpec]) -> List[str]:
    """The names of the tools that run model-written code (ToolSpec.runs_model_code), sorted."""
    return sorted(name for name, spec in specs.items() if spec.runs_model_code)


def normalise_path(path: str) -> str:
    """``module.function`` or ``module:function`` -> ``module:function``."""
    try:
        module, attr = split_path(path)
    except PluginImportError:
        raise ToolConfigError(f"tool function {path!r}: expected 'module:function'") from None
    return f"{module}:{attr}"


def import_function(path: str, what: str = "tool function") -> Callable:
    """``module:function`` (or ``module.function``) -> the function (the shared plug-in loader)."""
    try:
        return import_callable(normalise_path(path))
    except PluginImportError as exc:
        if exc.imported:
            raise ToolConfigError(f"{what} {path!r} is not callable ({exc})") from None
        raise ToolConfigError(f"{what} {path!r} cannot be imported: {exc}") from None


def _spec(entry: Union[str, Dict[str, Any]], where: str) -> ToolSpec:
    if isinstance(entry, str):
        if entry in BUILTIN_TOOLS:
            return BUILTIN_TOOLS[entry]
        if ":" not in entry and "." not in entry:
            raise ToolConfigError(
                f"{where}: unknown tool {entry!r}; built in: {', '.join(sorted(BUILTIN_TOOLS))}, "
                "or a registered function as 'module:function'"
            )
        marked = getattr(import_function(entry), "tool_spec", None)
        if marked is None:
            raise ToolConfigError(
                f"{where}: {entry!r} is not marked with @tool (or describe it in a tool config "
                "file with name, function, description, parameters)"
            )
        return ToolSpec(function=normalise_path(entry), **marked)
    if isinstance(entry, dict):
        unknown = set(entry) - {"name", "function", "description", "parameters", "runs_model_code"}
        if unknown or not entry.get("name") or not entry.get("function"):
            raise ToolConfigError(
                f"{where}: a tool entry needs name and function (description, parameters, runs_model_code "
                f"optional); got keys {sorted(entry)}"
            )
        if not isinstance(entry.get("runs_model_code", True), bool):
            raise ToolConfigError(f"{where}: runs_model_code must be true or false")
        import_function(entry["function"])
        return ToolSpec(
            entry["name"],
            normalise_path(entry["function"]),
            entry.get("description", ""),
            entry.get("parameters") or {"type": "object", "properties": {}},
            entry.get("runs_model_code", True),
        )
    raise ToolConfigError(f"{where}: a tool is a name, 'module:function' or a mapping, not {type(entry).__name__}")


def load_tool_file(path: str) -> list:
    """The ``tools`` list of a tool config YAML file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ToolConfigError(f"tool_config_path {path}: {exc.strerror}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise ToolConfigError(f"tool_config_path {path}: expected a mapping with a 'tools' list")
    return data["tools"]


def resolve_tools(
    entries: Iterable[Union[str, Dict[str, Any]]] = (), tool_config_path: str = "", where: str = "rl_config.tools"
) -> Dict[str, ToolSpec]:
    """name -> spec for the config's tools (names, paths, mappings) and the tool config file's."""
    specs: Dict[str, ToolSpec] = {}
    sources = [(entry, f"{where}[{i}]") for i, entry in enumerate(entries or [])]
    if tool_config_path:
        sources += [
            (entry, f"{tool_config_path} tools[{i}]") for i, entry in enumerate(load_tool_file(tool_config_path))
        ]
    for entry, label in sources:
        spec = _spec(entry, label)
        if spec.name in specs and specs[spec.name] != spec:
            raise ToolConfigError(f"{label}: two different tools are named {spec.name!r}")
        specs[spec.name] = spec
    return specs
