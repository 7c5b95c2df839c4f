"""Tools a model may call during a multi-turn rollout: their specs (name, JSON schema, the function that
runs them), the tool-call parsers, and the sandbox process every call runs in. Importable without torch:
the sandbox's child process imports this package only."""

from .parser import PARSERS, ParsedTurn, ToolCall, parse_hermes
from .registry import BUILTIN_TOOLS, ToolConfigError, ToolSpec, resolve_tools, tool
from .sandbox import Sandbox, SandboxLimits, ToolResult

__all__ = [
    "BUILTIN_TOOLS",
    "PARSERS",
    "ParsedTurn",
    "Sandbox",
    "SandboxLimits",
    "ToolCall",
    "ToolConfigError",
    "ToolResult",
    "ToolSpec",
    "parse_hermes",
    "resolve_tools",
    "tool",
]
