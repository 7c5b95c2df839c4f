"""Prompts with images as vLLM takes them.

A stored prompt holds one <|image_pad|> per image token (what training and the token budgets need). vLLM's
Qwen2-VL-style processors expand each image's placeholder themselves: given an already expanded run they
expand its first token again (a 16-token image became 31 tokens on vLLM 0.32), so each run is collapsed to one
placeholder, and vLLM's expansion gives back the stored prompt.
"""

from __future__ import annotations

import io
from typing import Dict, List, Sequence


def collapse_image_runs(ids: Sequence[int], image_token_id: int) -> List[int]:
    """Each maximal run of ``image_token_id`` as one token."""
    out: List[int] = []
    for token in ids:
        if token == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(int(token))
    return out


def vllm_prompt(ids: Sequence[int], images: bytes, image_token_id: int) -> Dict:
    """vLLM's input of one prompt: token ids, and with images their placeholders collapsed and the images
    decoded (RGB, at the size the dataset fitted them to)."""
    if not images:
        return {"prompt_token_ids": list(ids)}
    from PIL import Image

    from ..datasets.images import unpack_images

    pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in unpack_images(images)]
    collapsed = collapse_image_runs(ids, image_token_id)
    runs = sum(1 for t in collapsed if t == image_token_id)
    if runs != len(pictures):
        raise ValueError(f"a prompt with {runs} image placeholder runs carries {len(pictures)} images")
    return {"prompt_token_ids": collapsed, "multi_modal_data": {"image": pictures}}
