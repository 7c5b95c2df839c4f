"""``rl_config.agent`` and ``rl_config.sandbox``: how the tool agent runs its turns, and the limits and isolation of
each tool call (docs/agents.md). Their keys were flat in ``rl_config`` before (``max_turns``, ``tool_timeout``,
...): those spellings are still read, with a one-line note, for one release (``nest_flat_keys``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple

from .base import ConfigError, opt


@dataclass
class AgentConfig:
    """The tool agent's loop (rollout_function tool_agent)."""

    tool_parser_format: str = opt("hermes", "Tool-call format of the model's turns.", choices=("hermes",))
    max_turns: int = opt(4, "Most assistant turns of a trajectory.", ge=1)
    max_tool_calls: int = opt(4, "Most tool calls of a trajectory; a turn asking for more ends it.", ge=0)
    max_parallel_calls: int = opt(1, "Most tool calls run per turn; more are answered with an error.", ge=1)
    max_tool_response_length: int = opt(512, "Characters of a tool result kept (the rest cut, marked).", ge=1)
    tool_response_truncate_side: str = opt(
        "middle",
        "Which part of a long tool result is kept: left (its end), right (its start) or middle (both ends).",
        choices=("left", "right", "middle"),
    )
    tool_workers: int = opt(2, "Tool calls run side by side.", ge=1)


@dataclass
class SandboxConfig:
    """Each tool call's process: its isolation and limits (tools/sandbox.py)."""

    isolation: str = opt(
        "bwrap",
        "How tool calls are isolated from the run: bwrap (bubblewrap: own namespaces, never host root, a read-only "
        "view of the interpreter only, a RAM scratch folder, seccomp; tools that run model code are refused at "
        "start where it cannot run) or none (a plain child process with the driver's rights: only for trusted "
        "tools; warned at start).",
        choices=("bwrap", "none"),
    )
    timeout: float = opt(10.0, "Wall-clock seconds of one tool call before its processes are killed.", gt=0)
    cpu_seconds: int = opt(10, "CPU seconds of one tool call (RLIMIT_CPU).", ge=1)
    memory_mb: int = opt(1024, "Address space of one tool call's process, MB (RLIMIT_AS).", ge=64)
    max_result_bytes: int = opt(65536, "A longer tool result is refused with an error message.", ge=1)
    scratch_mb: int = opt(64, "Size of a tool call's scratch folder under bwrap, MB (a RAM file system).", ge=1)


# the flat spellings of the release before: rl_config.<flat> -> rl_config.<section>.<key>
FLAT_KEYS: Dict[str, Tuple[str, str]] = {
    **{key: ("agent", key) for key in AgentConfig.__dataclass_fields__},
    "tool_timeout": ("sandbox", "timeout"),
    "tool_cpu_seconds": ("sandbox", "cpu_seconds"),
    "tool_memory_mb": ("sandbox", "memory_mb"),
    "tool_max_result_bytes": ("sandbox", "max_result_bytes"),
    "tool_isolation": ("sandbox", "isolation"),
    "tool_scratch_mb": ("sandbox", "scratch_mb"),
}


def nest_flat_keys(rl_data: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """``rl_data`` with the flat spellings moved into their sections (a flat key given beside its nested one
    wins: it is the one an override on the command line sets), and the moved keys' names. Anything but a mapping is
    left as it is, for the section builder to refuse."""
    if not isinstance(rl_data, Mapping):
        return rl_data, []
    data = dict(rl_data)
    moved = []
    for flat, (section, key) in FLAT_KEYS.items():
        if flat not in data:
            continue
        nested = data.get(section) if data.get(section) is not None else {}
        if not isinstance(nested, Mapping):
            raise ConfigError(f"rl_config.{section}", "must be a mapping")
        data[section] = {**nested, key: data.pop(flat)}
        moved.append(flat)
    return data, moved


def deprecation_note(moved: List[str]) -> str:
    """The one line said when flat spellings were read."""
    new = ", ".join(f"rl_config.{'.'.join(FLAT_KEYS[k])}" for k in moved)
    return (
        f"note: {', '.join(f'rl_config.{k}' for k in moved)}: old spelling(s), read as {new} (until the next release)"
    )
