"""Prompts with images as vLLM takes them.

A stored prompt holds one <|image_pad|> per image token (what training and the token budgets need). vLLM's
Qwen2-VL-style processors expand each image's placeholder themselves: given an already expanded run they
expand its first token again (a 16-token image became 31 tokens on vLLM 0.32), so each run is collapsed to one
placeholder, and vLLM's expansion gives back the stored prompt.
"""

from __future__ import annotations

import io
from typing import Dict, List, Optional, Sequence


def collapse_image_runs(ids: Sequence[int], image_token_id: int, runs: Optional[int] = None) -> List[int]:
    """Each maximal run of ``image_token_id`` as one token; with ``runs``, only the first ``runs`` runs (the
    prompt's images: a continued trajectory whose response sampled the token keeps it, and vLLM reads it as a
    word, as the trainer does)."""
    out: List[int] = []
    run = 0
    for i, token in enumerate(ids):
        starts = token == image_token_id and (i == 0 or ids[i - 1] != image_token_id)
        run += starts
        if token == image_token_id and not starts and (runs is None or run <= runs):
            continue
        out.append(int(token))
    return out


def vllm_prompt(ids: Sequence[int], images: bytes, image_token_id: int) -> Dict:
    """vLLM's input of one prompt: token ids, and with images their placeholders collapsed and the images
    decoded (RGB, at the size the dataset fitted them to)."""
    if not images:
        return {"prompt_token_ids": list(ids)}
    from PIL import Image

    from ...datasets.images import unpack_images

    pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in unpack_images(images)]
    runs = sum(1 for i, t in enumerate(ids) if t == image_token_id and (i == 0 or ids[i - 1] != image_token_id))
    if runs < len(pictures):
        raise ValueError(f"a prompt with {runs} image placeholder runs carries {len(pictures)} images")
    collapsed = collapse_image_runs(ids, image_token_id, len(pictures))
    return {"prompt_token_ids": collapsed, "multi_modal_data": {"image": pictures}}
