"""Rows -> samples. A handler returns (sample, None) or (None, skip reason)."""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Tuple

from .dataset_config import DatasetConfig
from .templates import apply_template

Sample = Dict[str, Any]


def longest_token(tokenizer) -> Optional[int]:
    """Characters of the longest vocabulary entry: no token covers more characters of a text (a byte-level
    entry spells one byte per character, and a character is at least one byte). None for a tokenizer that
    does not list its vocabulary (then every prompt is tokenised before its length check)."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    return max((len(token) for token in get_vocab()), default=1) or 1


class AlpacaStyleInstructionHandler:
    """Prompt from map_keys.prompt (+ query, system) in the chat template; labels = the response."""

    token_fields: Tuple[str, ...] = ("input_ids",)  # stored as int32 token ids; additional keys as text
    binary_fields: Tuple[str, ...] = ()  # stored as raw bytes

    def __init__(self, cfg: DatasetConfig, tokenizer, tools: Optional[Mapping[str, Any]] = None):
        """``tools``: name -> ToolSpec of the config's tools, resolved by the caller (the entry point)."""
        self.cfg, self.tokenizer = cfg, tokenizer
        self.keys = {k: v for k, v in cfg.map_keys.items() if v}
        self.tools = dict(tools or {})
        self.longest_token = longest_token(tokenizer)

    def _field(self, row: dict, role: str, required: bool) -> Tuple[Optional[str], Optional[str]]:
        name = self.keys.get(role)
        if not name:
            return "", None
        if name not in row or row[name] is None:
            return (None, f"missing_key:{name}") if required else ("", None)
        value = row[name]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and role == "response":
            value = str(value)
        if not isinstance(value, str):
            return None, f"not_a_string:{name}"
        return value, None

    def label(self, response: str) -> str:
        return response.strip()

    def _tools(self, row: dict) -> Tuple[list, Optional[str]]:
        """The tools this row's prompt lists: the config's, narrowed by the row's 'tools' names."""
        names = row.get("tools")
        if names is None:
            return list(self.tools.values()), None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return [], "tools_not_a_list_of_names"
        unknown = [n for n in names if n not in self.tools]
        if unknown:
            return [], f"unknown_tool:{unknown[0]}"
        return [self.tools[n] for n in names], None

    def prompt_ids(self, row: Any) -> Tuple[Optional[list], Optional[str]]:
        """The row's prompt in the chat template as token ids, at most seq_length of them (else ``too_long``)."""
        if not isinstance(row, dict):
            return None, "not_an_object"
        prompt, why = self._field(row, "prompt", True)
        if why:
            return None, why
        if not prompt.strip():
            return None, "empty_prompt"
        query, why = self._field(row, "query", False)
        if why:
            return None, why
        system, why = self._field(row, "system", False)
        if why:
            return None, why
        tools, why = self._tools(row)
        if why:
            return None, why
        text = apply_template(self.cfg.prompt_type, prompt, query, system or None, tools)
        if self.longest_token and len(text) > self.cfg.seq_length * self.longest_token:
            return None, "too_long"  # more tokens than seq_length for sure: not tokenised (a huge row would cost GBs)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > self.cfg.seq_length:
            return None, "too_long"
        return ids, None

    def add_extra_keys(self, row: dict, sample: Sample) -> Optional[str]:
        """dataset_additional_keys into ``sample`` (labels: the answer; tools: the names the prompt lists; other
        keys as the row's text); the skip reason, or None."""
        for key in self.cfg.dataset_additional_keys:
            if key == "labels":
                response, why = self._field(row, "response", True)
                if why:
                    return why
                label = self.label(response)
                if not label:
                    return "empty_label"
                sample["labels"] = label
            elif key == "tools":
                tools, _ = self._tools(row)  # already checked with the prompt
                sample["tools"] = json.dumps([spec.name for spec in tools])
            else:
                value = row.get(key)
                if value is None:
                    return f"missing_key:{key}"
                sample[key] = value if isinstance(value, str) else str(value)
        return None

    def process(self, row: Any) -> Tuple[Optional[Sample], Optional[str]]:
        ids, why = self.prompt_ids(row)
        if why:
            return None, why
        sample: Sample = {"input_ids": ids}
        why = self.add_extra_keys(row, sample)
        return (None, why) if why else (sample, None)


class R1AlpacaStyleInstructionHandler(AlpacaStyleInstructionHandler):
    """As the Alpaca handler, with labels reduced to the final answer.

    GSM8K's '... #### 72' gives '72'; a \\boxed{...} answer gives its content; otherwise the
    whole (stripped) response is the label.
    """

    def label(self, response: str) -> str:
        from ..rewards.verifiers import last_boxed

        if "####" in response:
            return response.rsplit("####", 1)[1].strip().replace(",", "")
        boxed = last_boxed(response)
        return boxed if boxed is not None else response.strip()


class AlpacaStylePairwiseHandler(AlpacaStyleInstructionHandler):
    """Preference pairs for reward-model training: the prompt as the Alpaca handler builds it, and the
    map_keys.chosen / map_keys.rejected responses as token ids ending in EOS (``chosen_ids``, ``rejected_ids``).
    Skipped and counted: a missing or non-text response, an empty one, identical responses (the same text but for
    surrounding whitespace, or the same tokens), a prompt plus the longer response over seq_length."""

    token_fields = ("input_ids", "chosen_ids", "rejected_ids")

    def response_ids(self, row: dict, role: str) -> Tuple[Optional[list], Optional[str]]:
        text, why = self._field(row, role, True)
        if why:
            return None, why
        if not text.strip():
            return None, f"empty_{role}"
        eos = self.tokenizer.eos_token_id
        return self.tokenizer.encode(text, add_special_tokens=False) + ([eos] if eos is not None else []), None

    def process(self, row: Any) -> Tuple[Optional[Sample], Optional[str]]:
        ids, why = self.prompt_ids(row)
        if why:
            return None, why
        chosen, why = self.response_ids(row, "chosen")
        if why:
            return None, why
        rejected, why = self.response_ids(row, "rejected")
        if why:
            return None, why
        if chosen == rejected or row[self.keys["chosen"]].strip() == row[self.keys["rejected"]].strip():
            return None, "identical_pair"
        if len(ids) + max(len(chosen), len(rejected)) > self.cfg.seq_length:
            return None, "too_long"
        sample: Sample = {"input_ids": ids, "chosen_ids": chosen, "rejected_ids": rejected}
        why = self.add_extra_keys(row, sample)  # (labels is refused for pairs by the dataset config)
        return (None, why) if why else (sample, None)


class AlpacaStyleSFTHandler(AlpacaStyleInstructionHandler):
    """SFT examples from Alpaca-style rows: map_keys.prompt (+ query, system) is the user turn, map_keys.response
    the assistant's, map_keys.history earlier [user, assistant] pairs. Stored: the conversation's ``input_ids``
    and its ``loss_mask`` (1 on the assistant tokens; datasets/conversations.py). Skipped and counted: a missing or
    empty prompt or response, a history that is not a list of pairs, over seq_length tokens."""

    token_fields = ("input_ids", "loss_mask")

    def messages(self, row: dict) -> list:
        from .conversations import BadConversation

        fields = {}
        for role, required in (("prompt", True), ("query", False), ("response", True), ("system", False)):
            fields[role], why = self._field(row, role, required)
            if why:
                raise BadConversation(why)
        prompt, query, response, system = (fields[k] or "" for k in ("prompt", "query", "response", "system"))
        if not prompt.strip():
            raise BadConversation("empty_prompt")
        history = row.get(self.keys["history"], []) if self.keys.get("history") else []
        if not isinstance(history, list) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in history
        ):
            raise BadConversation("history_not_a_list_of_pairs")
        turns = [("system", system)] if system else []
        for user, assistant in history:
            turns += [("user", user), ("assistant", assistant)]
        return turns + [("user", prompt if not query else f"{prompt}\n{query}"), ("assistant", response)]

    def process(self, row: Any) -> Tuple[Optional[Sample], Optional[str]]:
        from .conversations import BadConversation, conversation_tokens

        if not isinstance(row, dict):
            return None, "not_an_object"
        tools, why = self._tools(row)
        if why:
            return None, why
        try:
            ids, mask = conversation_tokens(
                self.messages(row), self.tokenizer, self.cfg.prompt_type, self.cfg.seq_length, tools
            )
        except BadConversation as exc:
            return None, exc.reason
        sample: Sample = {"input_ids": ids, "loss_mask": mask}
        why = self.add_extra_keys(row, sample)
        return (None, why) if why else (sample, None)


class MessagesStyleSFTHandler(AlpacaStyleSFTHandler):
    """SFT examples from chat rows: map_keys.messages names a list of {"role", "content"} turns (system, user,
    assistant, tool) or ShareGPT's {"from", "value"} (human, gpt, observation); every assistant turn is trained,
    tool turns are rendered in the template's tool role (the config's ``tools`` listed in the system block, as for
    RL prompts). Skipped and counted: an unknown role, no assistant turn, turns out of order, an empty assistant
    turn, a tool turn in a template without a tool role, over seq_length tokens."""

    def messages(self, row: dict) -> list:
        from .conversations import BadConversation, normalised_messages

        name = self.keys.get("messages", "messages")
        if name not in row:
            raise BadConversation(f"missing_key:{name}")
        return normalised_messages(row[name])


class R1VisionInstructionHandler(R1AlpacaStyleInstructionHandler):
    """As the R1 handler, with the row's images (map_keys.image: one image or a list; a path relative to the input
        file's folder, bytes, or a {"bytes", "path"} record). Each ``<image>`` in the prompt (without any: every image,
        before the text) becomes <|vision_start|>, one <|image_pad|> per image token, <|vision_end|>; seq_length counts
        them. The images, fitted to min_pixels / max_pixels as the model's processor fits them (its patch and merge
    sizes, from the tokenizer folder's processor; Qwen2.5-VL's 14 x 2 without one), are stored as PNG in the
        ``images`` field (datasets/images.py). Skipped and counted: a missing, unreadable or 200:1 image, a field that
        is not an image or a list of them, and a prompt whose ``<image>`` count differs from its images; an image over
        max_image_pixels is skipped from its header, undecoded."""

    binary_fields = ("images",)
    MARKER = "<image>"
    VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")

    def __init__(self, cfg: DatasetConfig, tokenizer, tools: Optional[Mapping[str, Any]] = None):
        import os

        from ..config_cls.base import ConfigError
        from .images import pixel_budget

        super().__init__(cfg, tokenizer, tools)
        vocab = tokenizer.get_vocab()
        missing = [t for t in self.VISION_TOKENS if t not in vocab]
        if missing:
            raise ConfigError(
                "tokenizer_name_or_path", f"{cfg.tokenizer_name_or_path} lacks the vision tokens {missing}"
            )
        try:
            self.budget = pixel_budget(cfg.tokenizer_name_or_path, cfg.min_pixels, cfg.max_pixels)
        except ValueError as exc:
            raise ConfigError("min_pixels" if "min_pixels" in str(exc) else "max_pixels", str(exc)) from None
        self.base_dir = cfg.input if os.path.isdir(cfg.input) else os.path.dirname(os.path.abspath(cfg.input))

    def images(self, row: dict) -> Tuple[Optional[list], Optional[str]]:
        """[(png, image tokens)] of the row's images, or the skip reason."""
        from .images import BadImage, as_image_list, fitted_png, read_image

        values = as_image_list(row.get(self.keys["image"]))
        if values is None:
            return None, f"not_an_image_list:{self.keys['image']}"
        out = []
        for value in values:
            try:
                image = read_image(value, self.base_dir, self.cfg.max_image_pixels)
                png, height, width = fitted_png(image, self.budget)
            except BadImage as exc:
                return None, exc.reason
            out.append((png, self.budget.tokens(height, width)))
        return out, None

    def process(self, row: Any) -> Tuple[Optional[Sample], Optional[str]]:
        from .images import pack_images

        if not isinstance(row, dict):
            return None, "not_an_object"
        images, why = self.images(row)
        if why:
            return None, why
        prompt, why = self._field(row, "prompt", True)
        if why:
            return None, why
        markers = prompt.count(self.MARKER)
        if markers and markers != len(images):
            return None, "image_count_mismatch"
        pieces = (self.MARKER * len(images) + prompt if not markers else prompt).split(self.MARKER)
        start, pad, end = self.VISION_TOKENS
        text = pieces[0] + "".join(start + pad * n + end + piece for (_, n), piece in zip(images, pieces[1:]))
        ids, why = self.prompt_ids(dict(row, **{self.keys["prompt"]: text}))
        if why:
            return None, why
        sample: Sample = {"input_ids": ids, "images": pack_images([png for png, _ in images])}
        why = self.add_extra_keys(row, sample)
        return (None, why) if why else (sample, None)


HANDLERS = {
    cls.__name__: cls
    for cls in (
        AlpacaStyleInstructionHandler,
        R1AlpacaStyleInstructionHandler,
        AlpacaStylePairwiseHandler,
        AlpacaStyleSFTHandler,
        MessagesStyleSFTHandler,
        R1VisionInstructionHandler,
    )
}
