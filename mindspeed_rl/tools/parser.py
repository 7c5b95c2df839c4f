"""Tool-call parsers: the text of one assistant turn -> the calls it makes (``rl_config.tool_parser_format``).

hermes (Qwen2.5 / Qwen3, NousResearch Hermes, MindSpeed-RL's default)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 91"}}
    </tool_call>

A turn may hold several calls. A call whose body is not a JSON object with a string ``name`` and an object
(or JSON-encoded object) ``arguments``, or a ``<tool_call>`` never closed, is malformed: the loop answers it
with an error message and counts it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Dict[str, Any]


@dataclass
class ParsedTurn:
    calls: List[ToolCall] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)  # one message per malformed call

    @property
    def wants_tools(self) -> bool:
        return bool(self.calls or self.errors)


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> ParsedTurn:
    """Every ``<tool_call>{json}</tool_call>`` block of ``text``, in order."""
    turn = ParsedTurn()
    for body in _HERMES.findall(text):
        try:
            call = json.loads(body.strip())
        except json.JSONDecodeError as exc:
            turn.errors.append(f"malformed tool call: not JSON ({exc.msg} at character {exc.pos})")
            continue
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            turn.errors.append('malformed tool call: expected {"name": <string>, "arguments": <object>}')
            continue
        turn.calls.append(ToolCall(name, arguments))
    unclosed = text.count("<tool_call>") - text.count("</tool_call>")
    if unclosed > 0:
        turn.errors.append("malformed tool call: <tool_call> without </tool_call>")
    return turn


PARSERS: Dict[str, Callable[[str], ParsedTurn]] = {"hermes": parse_hermes}
