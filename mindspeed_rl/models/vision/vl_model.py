"""A vision-language model for megatron-core: the vision tower's image tokens spliced into the language
model's input embeddings, then the family's GPTModel with 3D rotary positions.

    e = Embed(input_ids);  e[input_ids == image_token] = Tower(pixel_values, grid_thw)
    logits = GPT(decoder_input = e, position_ids = mrope positions [3, B, S])

The tower lives on the pipeline's first stage (where the embedding is), replicated over TP ranks.
Sequence parallelism scatters the embedding before it could be spliced: not supported yet.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class VisionLanguageModel(nn.Module):
    def __init__(self, visual: Optional[nn.Module], language_model: nn.Module, image_token_id: int):
        super().__init__()
        self.visual = visual
        self.language_model = language_model
        self.image_token_id = image_token_id
        self.config = language_model.config

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        pixel_values: Optional[torch.Tensor] = None,
        image_grid_thw: Optional[torch.Tensor] = None,
        **kwargs,
    ):
        lm = self.language_model
        if pixel_values is None or not getattr(lm, "pre_process", True):
            return lm(input_ids, position_ids, attention_mask, **kwargs)
        embedded = lm.embedding(input_ids=input_ids, position_ids=None).transpose(0, 1)  # [B, S, H]
        where = input_ids == self.image_token_id
        features = self.visual(pixel_values, image_grid_thw).to(embedded.dtype)
        if int(where.sum()) != features.shape[0]:
            raise ValueError(
                f"{int(where.sum())} image placeholder tokens but the images give {features.shape[0]} image tokens"
            )
        embedded = embedded.masked_scatter(where.unsqueeze(-1), features)
        return lm(None, position_ids, attention_mask, decoder_input=embedded.transpose(0, 1).contiguous(), **kwargs)


def build_vision_language_model(model, megatron, vision_cfg, image_token_id: int, **gpt_kwargs) -> VisionLanguageModel:
    """The family's GPTModel (mrope) with a vision tower on the pipeline's first stage."""
    from ..builder import build_gpt_model
    from .qwen25_vit import Qwen25VisionTower

    gpt = build_gpt_model(model, megatron, **gpt_kwargs)
    visual = Qwen25VisionTower(vision_cfg) if gpt.pre_process else None
    if visual is not None:
        visual.to(device=next(gpt.parameters()).device)
    return VisionLanguageModel(visual, gpt, image_token_id)
