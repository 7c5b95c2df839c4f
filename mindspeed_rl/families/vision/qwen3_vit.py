"""Qwen3-VL's vision tower in plain torch: Qwen2.5-VL's tower without windows (every block attends over its
whole image), with LayerNorm, a plain GELU MLP, a learned position table resampled to each image's grid, and
DeepStack: mergers after some blocks whose tokens are added to the first language-model layers' outputs.

Parameter names are those of transformers' ``model.visual`` module, so HF checkpoints load by name.

    x = PatchEmbed(pixels) + bilinear(PosTable, grid)       [patches, d]
    x = x + Attn(LN(x), rope(row, col), image)              per block
    x = x + W_2 gelu(W_1 LN(x))
    deep_k = Merger_k(x after block deepstack_visual_indexes[k]), LN after the merge^2 concatenation
    tokens = W_2 gelu(W_1 concat_{merge^2}(LN(x)))          [patches / merge^2, d_lm]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .positions import image_bounds, patch_positions
from .qwen25_vit import PatchEmbed, VisionAttention, axial_rotary


@dataclass(frozen=True)
class Qwen3VisionConfig:
    """The ``vision_config`` of a Qwen3-VL config.json (transformers' names)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: Tuple[int, ...] = (8, 16, 24)
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0

    @classmethod
    def from_hf(cls, vision: dict) -> "Qwen3VisionConfig":
        names = {f for f in cls.__dataclass_fields__ if f != "rope_theta"}
        values = {k: v for k, v in vision.items() if k in names}
        values["deepstack_visual_indexes"] = tuple(vision.get("deepstack_visual_indexes", cls.deepstack_visual_indexes))
        theta = (vision.get("rope_parameters") or {}).get("rope_theta", vision.get("rope_theta", 10000.0))
        return cls(**values, rope_theta=float(theta))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def activation(name: str):
    if name in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise ValueError(f"vision_config.hidden_act {name!r} is not supported (gelu, gelu_pytorch_tanh)")


class VisionMLP(nn.Module):
    def __init__(self, cfg: Qwen3VisionConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, cfg: Qwen3VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x, cos, sin, bounds):
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """merge^2 neighbouring patches -> one language-model token; ``postshuffle``: the norm after concatenating
    (DeepStack's mergers), else before (the final merger)."""

    def __init__(self, cfg: Qwen3VisionConfig, postshuffle: bool):
        super().__init__()
        self.width = cfg.hidden_size * cfg.spatial_merge_size**2
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.width if postshuffle else cfg.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.width)) if self.postshuffle else self.norm(x).view(-1, self.width)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class Qwen3VisionTower(nn.Module):
    """pixel_values [patches, C * T_patch * P * P] and grid_thw [images, 3] -> ([image tokens, d_lm], the
    DeepStack features: one [image tokens, d_lm] per deepstack_visual_indexes entry)."""

    def __init__(self, cfg: Qwen3VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg, bias=True)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.side = int(cfg.num_position_embeddings**0.5)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, postshuffle=False)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(cfg, postshuffle=True) for _ in cfg.deepstack_visual_indexes
        )
        half = cfg.head_dim // 2
        self.register_buffer(
            "inv_freq", 1.0 / cfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float) / half), False
        )

    def learned_positions(self, grid_thw: torch.Tensor) -> torch.Tensor:
        """[patches, d]: the side x side table resampled to each image's h x w patches (bilinear, corners
        aligned), in block-major order, repeated over frames."""
        table = self.pos_embed.weight.view(self.side, self.side, -1).permute(2, 0, 1).unsqueeze(0)
        out = []
        for t, h, w in grid_thw.tolist():
            grid = F.interpolate(table.float(), size=(h, w), mode="bilinear", align_corners=True)[0]
            rc = patch_positions(torch.tensor([[1, h, w]]), self.cfg.spatial_merge_size)
            out.append(grid[:, rc[:, 0], rc[:, 1]].t().repeat(t, 1))
        return torch.cat(out).to(self.pos_embed.weight.dtype)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        cfg = self.cfg
        x = self.patch_embed(pixel_values)
        x = x + self.learned_positions(grid_thw).to(x.device, x.dtype)
        cos, sin = axial_rotary(grid_thw, cfg.spatial_merge_size, self.inv_freq, x.device)
        bounds = image_bounds(grid_thw)
        deep = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, bounds)
            if i in cfg.deepstack_visual_indexes:
                deep.append(self.deepstack_merger_list[cfg.deepstack_visual_indexes.index(i)](x))
        return self.merger(x), deep
