"""A megatron-core GPTModel that takes images: the family's vision tower attached to the first pipeline
stage's GPTModel (``gpt.visual``), its image tokens spliced into the input embeddings.

    e = Embed(input_ids);  e[input_ids == image_token] = Tower(pixel_values, image_grid_thw)
    output = GPT(decoder_input = e, position_ids = 3D rotary positions [3, B, S])

Attached rather than wrapped: the model keeps GPTModel's names (``embedding.*``, ``decoder.*``, ``output_layer``,
and ``visual.*`` beside them, the converters' layout) and everything that handles a GPTModel (DDP, the
optimizer, the LoRA and head patches, checkpoints) handles it unchanged. The tower is replicated over TP
ranks. Sequence parallelism scatters the embedding before the splice: not supported yet.
"""

from __future__ import annotations

import types
from typing import Optional, Tuple

import torch


def attach_vision_tower(gpt, vision_cfg, image_token_id: int) -> None:
    """Give a first-stage GPTModel ``vision_cfg``'s tower and an image-taking forward (later stages: nothing)."""
    from .qwen25_vit import Qwen25VisionTower

    if not getattr(gpt, "pre_process", True):
        return
    device = next(gpt.parameters()).device
    gpt.visual = Qwen25VisionTower(vision_cfg).to(device=device, dtype=next(gpt.parameters()).dtype)
    gpt.image_token_id = int(image_token_id)
    gpt.forward = types.MethodType(_forward_with_images, gpt)


def _forward_with_images(
    gpt,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    pixel_values: Optional[torch.Tensor] = None,
    image_grid_thw: Optional[torch.Tensor] = None,
    image_mask: Optional[torch.Tensor] = None,
    **kwargs,
):
    """``image_mask``: the positions the image features fill (default: every image token; a response that
    sampled the token holds it as a word)."""
    plain = type(gpt).forward
    if pixel_values is None or pixel_values.numel() == 0:
        return plain(gpt, input_ids, position_ids, attention_mask, **kwargs)
    embedded = gpt.embedding(input_ids=input_ids, position_ids=None).transpose(0, 1)  # [B, S, H]
    where = input_ids == gpt.image_token_id if image_mask is None else image_mask
    features = gpt.visual(pixel_values, image_grid_thw).to(embedded.dtype)
    if int(where.sum()) != features.shape[0]:
        raise ValueError(f"{int(where.sum())} image placeholder tokens but the images give {features.shape[0]} tokens")
    embedded = embedded.masked_scatter(where.unsqueeze(-1), features)
    return plain(gpt, None, position_ids, attention_mask, decoder_input=embedded.transpose(0, 1).contiguous(), **kwargs)


def vision_of(model, remove_padding: bool, cp: int) -> Optional[Tuple[int, int]]:
    """(image token id, spatial merge) of a vision-language model, None for a text model; refuses the layouts
    whose positions the vision path cannot give yet."""
    if not model.vision_config:
        return None
    if remove_padding or cp > 1:
        raise ValueError(
            "vision-language models train on padded rows for now: megatron's packed (thd) rotary restarts every "
            "segment at position 0 and context parallelism splits image tokens; set use_remove_padding false, "
            "context_parallel_size 1"
        )
    return int(model.image_token_id), int(model.vision_config.get("spatial_merge_size", 2))


def freeze_vision(gpt, tower: bool, projector: bool) -> int:
    """Stop the vision tower's blocks and patch embedding (``tower``) and/or its projector, the patch merger
    (``projector``), from training; returns the number of parameters frozen."""
    frozen = 0
    for name, param in getattr(gpt, "visual", torch.nn.Module()).named_parameters():
        if (projector if name.startswith("merger.") else tower) and param.requires_grad:
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen
