"""Chat templates from configs/model/templates.json, applied the same way in preprocessing and training."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

TEMPLATES_FILE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "model", "templates.json"
)


@functools.lru_cache(maxsize=None)
def load_templates(path: str = TEMPLATES_FILE) -> Dict[str, dict]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def template_names() -> list:
    return sorted(load_templates())


def tools_block(prompt_type: str, tools: Sequence) -> str:
    """The template's ``tools_format`` with the tools' JSON schemas ({tools}, one per line) and names
    ({tool_names}); ``tools`` are ToolSpecs."""
    t = load_templates()[prompt_type]
    if "tools_format" not in t:
        raise ValueError(
            f"prompt_type {prompt_type!r} cannot list tools: it has no tools_format in configs/model/templates.json"
        )
    return t["tools_format"].format(
        tools="\n".join(json.dumps(spec.schema()) for spec in tools), tool_names=", ".join(spec.name for spec in tools)
    )


def apply_template(
    prompt_type: str, prompt: str, query: str = "", system: Optional[str] = None, tools: Optional[Sequence] = None
) -> str:
    """The model input for one instruction: system block, user turn, assistant prefix.

        text = system_format(system [+ tools_format(tools)]) + prompt_prefix + prompt [+ "\\n" + query]
               + prompt_suffix
    ``system`` None uses the template's default system prompt; "" drops the system block (unless there are
    tools to list).
    """
    templates = load_templates()
    if prompt_type not in templates:
        raise KeyError(f"unknown prompt_type {prompt_type!r}; known: {', '.join(sorted(templates))}")
    t = templates[prompt_type]
    user = prompt if not query else f"{prompt}\n{query}"
    system_text = t.get("system", "") if system is None else system
    if tools:
        system_text = (
            (system_text + tools_block(prompt_type, tools)) if system_text else tools_block(prompt_type, tools).lstrip()
        )
    head = t.get("system_format", "{system}").format(system=system_text) if system_text else ""
    return head + t.get("prompt_prefix", "") + user + t.get("prompt_suffix", "")


@dataclass(frozen=True)
class ToolFormat:
    """How tool results enter the conversation (a chat template's tool role)."""

    turn_prefix: str  # after the assistant's end-of-turn token, before the first result
    response: str  # one result, with {content}
    turn_suffix: str  # after the last result: opens the next assistant turn

    @staticmethod
    def of_template(template: Dict[str, str], name: str) -> "ToolFormat":
        keys = ("tool_turn_prefix", "tool_response", "tool_turn_suffix")
        missing = [k for k in keys if k not in template]
        if missing:
            raise ValueError(
                f"prompt_type {name!r} has no tool role in configs/model/templates.json (missing {', '.join(missing)})"
            )
        return ToolFormat(*(template[k] for k in keys))

    def render(self, contents: Sequence[str]) -> str:
        return self.turn_prefix + "".join(self.response.format(content=c) for c in contents) + self.turn_suffix
