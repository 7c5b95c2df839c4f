"""configs/datasets/<name>.yaml: what cli/preprocess_data.py reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Dict, List

from ..config_cls.base import ConfigError, opt

HANDLERS = (
    "R1AlpacaStyleInstructionHandler",
    "AlpacaStyleInstructionHandler",
    "AlpacaStylePairwiseHandler",
    "AlpacaStyleSFTHandler",
    "MessagesStyleSFTHandler",
    "R1VisionInstructionHandler",
)
MAP_KEYS = ("prompt", "query", "response", "system", "history", "messages", "chosen", "rejected", "image", "video")
PAIRWISE = "AlpacaStylePairwiseHandler"
SFT_HANDLERS = ("AlpacaStyleSFTHandler", "MessagesStyleSFTHandler")
VISION = "R1VisionInstructionHandler"
MAX_IMAGE_PIXELS = 40_000_000  # about 300 MB to decode the largest image a row may hold
PIL_REFUSES = 2 * 89_478_485  # Pillow refuses larger images itself (DecompressionBombError)


@dataclass
class DatasetConfig:
    """Preprocessing of one dataset into indexed files."""

    input: str = opt(doc="A .jsonl, .json (array) or .parquet file, or a folder of them.")
    tokenizer_name_or_path: str = opt(doc="HF tokenizer folder.")
    output_prefix: str = opt(doc="Prefix of the output files (<prefix>_packed_<field>_document.bin/.idx).")
    tokenizer_type: str = opt(
        "HuggingFaceTokenizer", "Tokenizer kind.", choices=("HuggingFaceTokenizer", "PretrainedFromHF")
    )
    handler_name: str = opt("R1AlpacaStyleInstructionHandler", "How rows become samples.", choices=HANDLERS)
    workers: int = opt(1, "Worker processes.", ge=1)
    log_interval: int = opt(1000, "Log progress every this many rows.", ge=1)
    prompt_type: str = opt("qwen_r1", "Chat template from configs/model/templates.json.")
    map_keys: Dict[str, str] = opt(
        doc="Row field of prompt, query, response and system ('' = none); preference pairs "
        "(AlpacaStylePairwiseHandler): chosen and rejected; SFT: history (AlpacaStyleSFTHandler: earlier "
        "[user, assistant] pairs), messages (MessagesStyleSFTHandler: the list of turns).",
        factory=lambda: {"prompt": "question", "query": "", "response": "answer", "system": ""},
    )
    dataset_additional_keys: List[str] = opt(
        doc="Extra fields stored with each prompt (labels: the answer).", factory=lambda: ["labels"]
    )
    seq_length: int = opt(2048, "Prompts longer than this many tokens (image tokens included) are skipped.", ge=1)
    min_pixels: int = opt(
        56 * 56, "R1VisionInstructionHandler: images smaller than this are enlarged (Qwen2-VL's resizing rule).", ge=1
    )
    max_pixels: int = opt(
        28 * 28 * 1280,
        "R1VisionInstructionHandler: images larger than this are shrunk (Qwen2-VL's resizing rule).",
        ge=1,
    )
    max_image_pixels: int = opt(
        MAX_IMAGE_PIXELS,
        "R1VisionInstructionHandler: an image whose header gives more pixels than this is skipped (image_too_large) "
        f"before it is decoded: one row's memory stays within the limit (about 8 bytes a pixel). At most {PIL_REFUSES} "
        "(Pillow refuses larger images itself).",
        ge=1,
        le=PIL_REFUSES,
    )
    tools: List[str] = opt(
        doc="Tools listed in every prompt's system turn (the template's tools_format): "
        "built-in names (calculator, python) or registered functions 'module:function'. "
        "A row's own 'tools' field (a list of names) narrows them for that row.",
        factory=list,
    )
    tool_config_path: str = opt(
        "", "A YAML file with a 'tools' list (name, function, description, parameters), added to tools."
    )

    def check(self, path: str = "", given: AbstractSet[str] = frozenset()) -> None:
        """The keys' own rules (build_section calls it; the template and tool names resolve in
        trainer/startup/config_names.py)."""
        for key, value in self.map_keys.items():
            if key not in MAP_KEYS:
                raise ConfigError(f"map_keys.{key}", f"unknown; allowed: {', '.join(MAP_KEYS)}")
            if not isinstance(value, str):
                raise ConfigError(f"map_keys.{key}", f"got {value!r}, expected a field name (string)")
        if self.handler_name in SFT_HANDLERS and self.dataset_additional_keys:
            raise ConfigError(
                "dataset_additional_keys",
                f"{self.dataset_additional_keys}: {self.handler_name} stores input_ids and loss_mask; set it to []",
            )
        if self.handler_name == "MessagesStyleSFTHandler":
            if not self.map_keys.get("messages"):
                raise ConfigError(
                    "map_keys.messages", "required by MessagesStyleSFTHandler: the row field of the turns"
                )
        elif not self.map_keys.get("prompt"):
            raise ConfigError("map_keys.prompt", "required: the row field holding the prompt")
        if self.handler_name == "AlpacaStyleSFTHandler" and not self.map_keys.get("response"):
            raise ConfigError("map_keys.response", "required by AlpacaStyleSFTHandler: the row field of the answer")
        if self.handler_name == PAIRWISE:
            for role in ("chosen", "rejected"):
                if not self.map_keys.get(role):
                    raise ConfigError(f"map_keys.{role}", f"required by {PAIRWISE}: the row field of the {role} answer")
            if "labels" in self.dataset_additional_keys:
                raise ConfigError("dataset_additional_keys", f"labels: {PAIRWISE} stores chosen and rejected ids")
        elif "labels" in self.dataset_additional_keys and not self.map_keys.get("response"):
            raise ConfigError("map_keys.response", "required when dataset_additional_keys has labels")
        if self.map_keys.get("video"):
            raise ConfigError("map_keys.video", "videos are not supported yet: images only (docs/vision.md)")
        if self.handler_name == VISION and not self.map_keys.get("image"):
            raise ConfigError("map_keys.image", f"required by {VISION}: the row field holding the image(s)")
        if self.map_keys.get("image") and self.handler_name != VISION:
            raise ConfigError("handler_name", f"map_keys.image needs {VISION}; {self.handler_name} reads text only")
        if self.min_pixels > self.max_pixels:
            raise ConfigError("min_pixels", f"{self.min_pixels} exceeds max_pixels {self.max_pixels}")
