"""Qwen2.5-VL's vision tower in plain torch: 3D patch embedding, a ViT whose blocks attend inside windows
(full attention in ``fullatt_block_indexes``) with 2D rotary positions, and the merger that turns each
spatial_merge^2 block of patches into one language-model token.

Parameter names are those of transformers' ``model.visual`` module, so HF checkpoints load by name.

    x = PatchEmbed(pixels)                                  [patches, d]
    x = x + Attn(RMSNorm(x), rope(row, col), windows)       per block
    x = x + MLP(RMSNorm(x))                                 MLP(y) = W_d (silu(W_g y) * W_u y)
    tokens = W_2 gelu(W_1 concat_{merge^2}(RMSNorm(x)))     [patches / merge^2, d_lm]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .positions import image_bounds, patch_positions, window_order


@dataclass(frozen=True)
class VisionConfig:
    """The ``vision_config`` of a Qwen2.5-VL config.json (transformers' names)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    window_size: int = 112
    fullatt_block_indexes: Tuple[int, ...] = field(default=(7, 15, 23, 31))
    rope_theta: float = 10000.0

    @classmethod
    def from_hf(cls, vision: dict) -> "VisionConfig":
        names = {f for f in cls.__dataclass_fields__ if f != "rope_theta"}
        values = {k: v for k, v in vision.items() if k in names}
        values["fullatt_block_indexes"] = tuple(vision.get("fullatt_block_indexes", cls.fullatt_block_indexes))
        theta = (vision.get("rope_parameters") or {}).get("rope_theta", vision.get("rope_theta", 10000.0))
        return cls(**values, rope_theta=float(theta))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def axial_rotary(
    grid_thw: torch.Tensor, merge: int, inv_freq: torch.Tensor, device
) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [patches, 1, head_dim] of the towers' 2D rotary: the first half of the rotated channels turn with
    the row, the second with the column (each frequency once per half, as rotate_half pairs channel i with
    i + d/2); ``inv_freq`` holds head_dim / 4 frequencies."""
    rc = patch_positions(grid_thw, merge).to(device).float()
    angles = (rc[:, :, None] * inv_freq.float()).flatten(1)  # [patches, head_dim / 2]: rows, cols
    angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)
    return angles.cos(), angles.sin()


class PatchEmbed(nn.Module):
    def __init__(self, cfg, bias: bool = False):
        super().__init__()
        self.shape = (cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, self.shape[1:], stride=self.shape[1:], bias=bias)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.proj(pixels.view(-1, *self.shape).to(self.proj.weight.dtype)).flatten(1)


class VisionAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: List[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, -1).unbind(1)  # [n, heads, head_dim] each
        q, k = ((t.float() * cos + rotate_half(t.float()) * sin).to(x.dtype) for t in (q, k))
        sizes = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
        pieces = [
            F.scaled_dot_product_attention(*(t.transpose(0, 1).unsqueeze(0) for t in qkv))[0].transpose(0, 1)
            for qkv in zip(q.split(sizes), k.split(sizes), v.split(sizes))
        ]  # each window (or image) attends to itself only, without a causal mask
        return self.proj(torch.cat(pieces).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x, cos, sin, bounds):
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        width = cfg.hidden_size * cfg.spatial_merge_size**2
        self.width = width
        self.ln_q = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, cfg.out_hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


class Qwen25VisionTower(nn.Module):
    """pixel_values [patches, C * T_patch * P * P] and grid_thw [images, 3] -> [image tokens, d_lm]."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)
        half = cfg.head_dim // 2  # channels per axis (row, column); each axis turns half/2 frequencies
        self.register_buffer(
            "inv_freq", 1.0 / cfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float) / half), False
        )

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        unit = cfg.spatial_merge_size**2
        x = self.patch_embed(pixel_values)
        order, window_bounds = window_order(grid_thw, cfg.spatial_merge_size, cfg.window_size // cfg.patch_size)
        order = order.to(x.device)

        def windowed(t: torch.Tensor) -> torch.Tensor:  # merged-token blocks in window order
            return t.view(-1, unit, *t.shape[1:])[order].flatten(0, 1)

        rotary = axial_rotary(grid_thw, cfg.spatial_merge_size, self.inv_freq, x.device)
        cos, sin = (windowed(t) for t in rotary)
        x = windowed(x)
        full_bounds = image_bounds(grid_thw)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, full_bounds if i in cfg.fullatt_block_indexes else window_bounds)
        return self.merger(x)[torch.argsort(order)]
