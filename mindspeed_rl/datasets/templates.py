"""Chat templates from configs/model/templates.json, applied the same way in preprocessing and training."""
from __future__ import annotations

import functools
import json
import os
from typing import Dict, Optional

TEMPLATES_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "configs", "model", "templates.json")


@functools.lru_cache(maxsize=None)
def load_templates(path: str = TEMPLATES_FILE) -> Dict[str, dict]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def template_names() -> list:
    return sorted(load_templates())


def apply_template(prompt_type: str, prompt: str, query: str = "", system: Optional[str] = None) -> str:
    """The model input for one instruction: system block, user turn, assistant prefix.

        text = system_format(system) + prompt_prefix + prompt [+ "\\n" + query] + prompt_suffix
    ``system`` None uses the template's default system prompt; "" drops the system block.
    """
    templates = load_templates()
    if prompt_type not in templates:
        raise KeyError(f"unknown prompt_type {prompt_type!r}; known: {', '.join(sorted(templates))}")
    t = templates[prompt_type]
    user = prompt if not query else f"{prompt}\n{query}"
    system_text = t.get("system", "") if system is None else system
    head = t.get("system_format", "{system}").format(system=system_text) if system_text else ""
    return head + t.get("prompt_prefix", "") + user + t.get("prompt_suffix", "")
