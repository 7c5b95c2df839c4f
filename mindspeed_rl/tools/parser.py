"""Tool-call parsers: the text of one assistant turn -> the calls it makes (``rl_config.agent.tool_parser_format``).

hermes (Qwen2.5 / Qwen3, NousResearch Hermes, MindSpeed-RL's default)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 91"}}
    </tool_call>

A turn may hold several calls. A call whose body is not a JSON object with a string ``name`` and an object
(or JSON-encoded object) ``arguments``, or a ``<tool_call>`` never closed, is malformed: the loop answers it
with an error message and counts it. The parser is bounded for any text a model writes: one linear pass, at
most MAX_CALLS blocks per turn, MAX_CALL_CHARS per call, MAX_DEPTH levels of nesting; it never raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Tuple


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


OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 64  # blocks read per turn; more are answered with one error
MAX_CALL_CHARS = 256 * 1024  # one call's body
MAX_DEPTH = 32  # nesting of a call's JSON


def _depth(value: Any) -> int:
    """Nesting depth of decoded JSON (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _decode(body: str) -> Any:
    """A call's JSON, or raises ValueError with the message the model reads."""
    if len(body) > MAX_CALL_CHARS:
        raise ValueError(f"malformed tool call: longer than {MAX_CALL_CHARS} characters")
    too_deep = f"malformed tool call: nested deeper than {MAX_DEPTH} levels"
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed tool call: not JSON ({exc.msg} at character {exc.pos})") from None
    except RecursionError:
        raise ValueError(too_deep) from None
    if _depth(value) > MAX_DEPTH:
        raise ValueError(too_deep)
    return value


def _blocks(text: str) -> Tuple[List[str], int]:
    """The bodies of the closed ``<tool_call>`` blocks (at most MAX_CALLS + 1) and the number of opening tags
    never closed; one left-to-right pass."""
    bodies, at = [], 0
    while len(bodies) <= MAX_CALLS:
        start = text.find(OPEN, at)
        if start < 0:
            return bodies, 0
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            return bodies, text.count(OPEN, start)
        bodies.append(text[start + len(OPEN) : end])
        at = end + len(CLOSE)
    return bodies, 0


def parse_hermes(text: str) -> ParsedTurn:
    """Every ``<tool_call>{json}</tool_call>`` block of ``text``, in order, in time linear in its length."""
    turn = ParsedTurn()
    bodies, unclosed = _blocks(text)
    for body in bodies[:MAX_CALLS]:
        try:
            call = _decode(body.strip())
        except ValueError as exc:
            turn.errors.append(str(exc))
            continue
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = _decode(arguments)
            except ValueError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            turn.errors.append('malformed tool call: expected {"name": <string>, "arguments": <object>}')
            continue
        turn.calls.append(ToolCall(name, arguments))
    if len(bodies) > MAX_CALLS:
        turn.errors.append(f"malformed tool call: more than {MAX_CALLS} calls in one turn; the rest were not read")
    if unclosed > 0:
        turn.errors.append("malformed tool call: <tool_call> without </tool_call>")
    return turn


PARSERS: Dict[str, Callable[[str], ParsedTurn]] = {"hermes": parse_hermes}
