"""OpenAI-style chat messages in and out of a chat template of configs/model/templates.json.

The endpoint an outside agent talks to (rollout/endpoint/) receives conversations as messages; the policy reads
tokens. The template is applied here, once, the way preprocessing applies it (``apply_template``):

    conversation = system block + turn + (assistant turn + follow-up)* , a turn ending in the assistant's opening

    user turn       prompt_prefix + content + prompt_suffix           (consecutive user messages: one turn, "\\n")
    tool turn       tool_turn_prefix + tool_response(content)... + tool_turn_suffix    (consecutive tool messages)
    after an assistant turn (its end-of-turn token is the model's own): turn_separator, then a user turn;
    or a tool turn (whose prefix carries its own separator)

A first request renders whole (``render_conversation``); a later request of the same episode renders only what
follows the policy's last answer (``render_follow_up``), so the tokens the policy sampled are never re-tokenised.
``prompt_messages`` inverts ``apply_template`` for a prompt the dataset stores as text.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from .templates import load_templates

ROLES = ("system", "user", "assistant", "tool")


class MessageError(ValueError):
    """A conversation the template cannot render; the message says which message and why."""


def content_of(message: Mapping, k: int) -> str:
    """A message's text: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts."""
    if not isinstance(message, Mapping):
        raise MessageError(f"messages[{k}] is not an object")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise MessageError(f"messages[{k}].role is {role!r}; one of {', '.join(ROLES)}")
    if content is None and role == "assistant":
        return ""  # an assistant turn given back as tool_calls only: the policy's own tokens stand for it
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise MessageError(f"messages[{k}].content must be text (a string or text parts)")


def template_of(prompt_type: str) -> Dict[str, str]:
    templates = load_templates()
    if prompt_type not in templates:
        raise KeyError(f"unknown prompt_type {prompt_type!r}; known: {', '.join(sorted(templates))}")
    return templates[prompt_type]


def _turns(messages: Sequence[Mapping], start: int) -> List[tuple]:
    """(role, [contents]) runs of consecutive user / tool / assistant messages from ``start``."""
    turns: List[tuple] = []
    for k in range(start, len(messages)):
        role, text = messages[k].get("role"), content_of(messages[k], k)
        if role == "system":
            raise MessageError(f"messages[{k}]: a system message is allowed only first")
        if turns and turns[-1][0] == role and role != "assistant":
            turns[-1][1].append(text)
        else:
            turns.append((role, [text]))
    return turns


def _render_turns(t: Dict[str, str], turns: Sequence[tuple], after_assistant: bool, eos: str, first: int) -> str:
    text = ""
    for j, (role, contents) in enumerate(turns):
        if role == "assistant":
            if j == 0 and not after_assistant:
                raise MessageError(f"messages[{first}]: the conversation opens with an assistant message")
            text += contents[0] + eos
        elif role == "user":
            text += (t.get("turn_separator", "") if after_assistant or j else "") + t.get("prompt_prefix", "")
            text += "\n".join(contents) + t.get("prompt_suffix", "")
        else:
            if "tool_response" not in t:
                raise MessageError("a tool message, but the chat template has no tool role (tool_response)")
            body = "".join(t["tool_response"].format(content=c) for c in contents)
            text += t["tool_turn_prefix"] + body + t["tool_turn_suffix"]
        after_assistant = role == "assistant"
    if after_assistant:
        raise MessageError("the conversation ends with an assistant message: nothing asks for the next turn")
    return text


def render_conversation(prompt_type: str, messages: Sequence[Mapping], eos: str) -> str:
    """A whole conversation up to the opening of the next assistant turn. No system message: the template's
    default system prompt, as ``apply_template`` gives it; earlier assistant turns end with ``eos``."""
    if not messages:
        raise MessageError("messages is empty")
    t = template_of(prompt_type)
    system: Optional[str] = t.get("system", "")
    start = 0
    if messages[0].get("role") == "system":
        system, start = content_of(messages[0], 0), 1
    head = t.get("system_format", "{system}").format(system=system) if system else ""
    return head + _render_turns(t, _turns(messages, start), False, eos, start)


def render_follow_up(prompt_type: str, messages: Sequence[Mapping], first: int = 0) -> str:
    """What follows an assistant turn the policy generated (its end-of-turn token included): the user and tool
    messages ``messages`` (numbered from ``first`` in the request), up to the next assistant opening."""
    if not messages:
        raise MessageError("no message after the assistant's turn: nothing asks for the next turn")
    turns = _turns(messages, 0)
    if turns[0][0] == "assistant":
        raise MessageError(f"messages[{first}]: two assistant messages in a row")
    return _render_turns(template_of(prompt_type), turns, True, "", first)


def prompt_messages(prompt_type: str, text: str) -> List[Dict[str, str]]:
    """The system and user messages whose rendering is ``text`` (a prompt made by ``apply_template``); one user
    message holding ``text`` when the template's markers are not where it puts them."""
    t = template_of(prompt_type)
    prefix, suffix = t.get("prompt_prefix", ""), t.get("prompt_suffix", "")
    at = text.rfind(prefix) if prefix else 0
    if at < 0 or not text.endswith(suffix):
        return [{"role": "user", "content": text}]
    user = text[at + len(prefix) : len(text) - len(suffix)]
    head, messages = text[:at], []
    if head:
        before, _, after = t.get("system_format", "{system}").partition("{system}")
        if not (head.startswith(before) and head.endswith(after)):
            return [{"role": "user", "content": text}]
        messages.append({"role": "system", "content": head[len(before) : len(head) - len(after)]})
    else:
        messages.append({"role": "system", "content": ""})
    return messages + [{"role": "user", "content": user}]
