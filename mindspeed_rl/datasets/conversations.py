"""Instruction data for supervised fine-tuning: a conversation (system, user and assistant turns) as token ids and
a loss mask, in the chat template the RL stages use (configs/model/templates.json).

    ids  = template(system) + prefix + user_1 + suffix | assistant_1 EOS | separator + prefix + user_2 + suffix | ...
    mask = 0 ...                                       | 1 ...           | 0 ...

Each piece is tokenised on its own, as the agent loop builds multi-turn rollouts, so an SFT model's turns are the
tokens RL later samples; an assistant turn ends with the tokenizer's EOS (the token rollout stops on). The
``separator`` (template key ``turn_separator``, ChatML's newline) follows an assistant turn that is not the last.

Tool turns (role ``tool``; ShareGPT's ``observation``) follow an assistant turn that called tools: consecutive ones
are one tool turn, rendered by the template's tool role exactly as the agent loop appends tool results, never
trained; the assistant turn after them continues at once (the tool role's suffix opens it). The tools a row may
call are listed in its system block (the template's ``tools_format``), as in the RL prompts.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .templates import ToolFormat, apply_template, load_templates

ROLE_NAMES = {
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "human": "user",
    "gpt": "assistant",
    "observation": "tool",
}
NEXT_ROLES = {"start": ("user",), "user": ("assistant",), "assistant": ("user", "tool"), "tool": ("tool", "assistant")}


class BadConversation(ValueError):
    """A row that cannot become an SFT example; ``reason`` is its skip-summary key."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def normalised_messages(raw: Any) -> List[Tuple[str, str]]:
    """[(role, text)] of a messages list: {"role", "content"} entries (OpenAI / chat-template style) or
    {"from", "value"} (ShareGPT: human, gpt)."""
    if not isinstance(raw, list) or not raw:
        raise BadConversation("not_a_message_list")
    out = []
    for message in raw:
        if not isinstance(message, dict):
            raise BadConversation("message_not_an_object")
        role = message.get("role", message.get("from"))
        text = message.get("content", message.get("value"))
        if role not in ROLE_NAMES:
            raise BadConversation(f"unknown_role:{role}")
        if not isinstance(text, str):
            raise BadConversation("content_not_a_string")
        out.append((ROLE_NAMES[role], text))
    return out


def check_turns(messages: Sequence[Tuple[str, str]]) -> None:
    """A system turn at most first, then a user turn; an assistant turn answers a user or tool turn, tool turns
    follow an assistant's; the last turn is an assistant's."""
    turns = list(messages[1:] if messages and messages[0][0] == "system" else messages)
    if not any(role == "assistant" for role, _ in turns):
        raise BadConversation("no_assistant_turn")
    previous = "start"
    for role, _ in turns:
        if role not in NEXT_ROLES[previous]:
            raise BadConversation("turns_out_of_order")
        previous = role
    if previous != "assistant":
        raise BadConversation("turns_out_of_order")
    if any(role == "assistant" and not text.strip() for role, text in turns):
        raise BadConversation("empty_response")


def conversation_tokens(
    messages: Sequence[Tuple[str, str]],
    tokenizer,
    prompt_type: str,
    max_length: Optional[int] = None,
    tools: Optional[Sequence] = None,
) -> Tuple[List[int], List[int]]:
    """(ids, loss mask) of a checked conversation (``tools``: the ToolSpecs its system block lists);
    BadConversation("too_long") past ``max_length`` tokens, ("no_tool_role") for a tool turn in a template
    without one."""
    check_turns(messages)
    template = load_templates()[prompt_type]
    separator = template.get("turn_separator", "")
    tool_format = ToolFormat.of_template(template, prompt_type) if "tool_response" in template else None
    system: Optional[str] = None  # the template's default system prompt
    if messages[0][0] == "system":
        system, messages = messages[0][1], messages[1:]
    eos = tokenizer.eos_token_id
    text = ""
    results: List[str] = []  # the tool turn being gathered
    ids: List[int] = []
    mask: List[int] = []
    for k, (role, content) in enumerate(messages):
        if role == "user":  # the system block before the first user turn only
            text += apply_template(
                prompt_type, content, system=system if k == 0 else "", tools=tools if k == 0 else None
            )
            continue
        if role == "tool":
            results.append(content)
            continue
        if results:
            if tool_format is None:
                raise BadConversation("no_tool_role")
            text, results = tool_format.render(results), []
        piece = tokenizer.encode(text, add_special_tokens=False)
        answer = tokenizer.encode(content, add_special_tokens=False) + ([eos] if eos is not None else [])
        ids += piece + answer
        mask += [0] * len(piece) + [1] * len(answer)
        following = messages[k + 1][0] if k + 1 < len(messages) else None
        text = separator if following == "user" else ""
        if max_length is not None and len(ids) > max_length:
            raise BadConversation("too_long")
    return ids, mask


def sft_rows(items: Sequence[Dict], pad_id: int = 0) -> Dict[str, torch.Tensor]:
    """Right-padded rows of SFT examples: input_ids, attention_mask and loss_mask (1 on the trained tokens)."""
    width = max(len(item["input_ids"]) for item in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(items), width), dtype=torch.long)
    loss_mask = torch.zeros((len(items), width), dtype=torch.long)
    for b, item in enumerate(items):
        n = len(item["input_ids"])
        ids[b, :n] = torch.tensor(item["input_ids"])
        attention[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(item["loss_mask"])
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}
