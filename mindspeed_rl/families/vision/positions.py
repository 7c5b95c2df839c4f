"""Where image tokens sit: the tower's 2D patch positions and attention windows, the language model's 3D
(temporal, height, width) rotary positions.

Patches arrive block-major: each spatial_merge x spatial_merge block of neighbouring patches is contiguous,
because the merger concatenates a block into one language-model token.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch


def patch_positions(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """[patches, 2] (row, column) of every patch in block-major order, repeated over each image's frames."""
    out = []
    for t, h, w in grid_thw.tolist():
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        block_major = lambda x: x.permute(0, 2, 1, 3).reshape(-1)  # noqa: E731
        out.append(torch.stack([block_major(rows), block_major(cols)], dim=-1).repeat(t, 1))
    return torch.cat(out)


def image_bounds(grid_thw: torch.Tensor) -> List[int]:
    """Cumulative patch counts: image (frame) i holds patches [b_i, b_{i+1})."""
    sizes = [h * w for t, h, w in grid_thw.tolist() for _ in range(t)]
    return [0] + torch.tensor(sizes).cumsum(0).tolist()


def window_order(grid_thw: torch.Tensor, merge: int, window_patches: int) -> Tuple[torch.Tensor, List[int]]:
    """Window attention's layout, in merged tokens (blocks of merge^2 patches).

    Each frame's grid of merged tokens is cut into windows of ``window_patches / merge`` x same tokens
    (the last row and column of windows may be smaller); returns the permutation that makes every window
    contiguous and the cumulative window sizes in patches.
    """
    side = window_patches // merge
    order, bounds, offset = [], [0], 0
    for t, h, w in grid_thw.tolist():
        gh, gw = h // merge, w // merge
        index = torch.arange(t * gh * gw).view(t, gh, gw)
        for frame in range(t):
            for r in range(0, gh, side):
                for c in range(0, gw, side):
                    window = index[frame, r : r + side, c : c + side].reshape(-1)
                    order.append(window + offset)
                    bounds.append(bounds[-1] + window.numel() * merge * merge)
        offset += t * gh * gw
    return torch.cat(order), bounds


def mrope_positions(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_token_id: int,
    grid_thw: torch.Tensor,
    merge: int,
) -> torch.Tensor:
    """[3, B, S] rotary positions. Text tokens count up on all three axes; an image's tokens take
    (p, p + row, p + column) with p the position after the text before it, and the text after it resumes at
    p + max(rows, columns). Padding positions get 0. Images are consumed in row order, left to right.

        t_i = h_i = w_i = p + k                       (k-th text token after position p)
        (t, h, w) = (p, p + r, p + c)                 (merged image token at row r, column c)
    """
    return image_layout(input_ids, attention_mask, image_token_id, grid_thw, merge)[0]


def image_layout(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_token_id: int,
    grid_thw: torch.Tensor,
    merge: int,
    images_per_row: Optional[Sequence[int]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(3D positions [3, B, S] as ``mrope_positions``, mask [B, S] of the positions the images' features fill).

    ``images_per_row``: how many of ``grid_thw``'s images each row holds; an image token after a row's last
    image is text (a response may sample the placeholder token: vLLM embeds it as a word, and so do we)."""
    batch, seq = input_ids.shape
    out = torch.zeros(3, batch, seq, dtype=torch.long)
    filled = torch.zeros(batch, seq, dtype=torch.bool)
    grids = iter(grid_thw.tolist())
    for b in range(batch):
        real = attention_mask[b].bool()
        ids = input_ids[b][real].tolist()
        left = None if images_per_row is None else int(images_per_row[b])  # None: as many as the row has runs
        pos: List[torch.Tensor] = []
        image: List[bool] = []
        p, i = 0, 0
        while i < len(ids):
            if ids[i] != image_token_id or left == 0:
                j = i + 1
                while j < len(ids) and (ids[j] != image_token_id or left == 0):
                    j += 1
                pos.append(torch.arange(p, p + j - i).expand(3, -1))
                image += [False] * (j - i)
                p += j - i
                i = j
                continue
            t, h, w = next(grids)
            if t != 1:
                raise ValueError(f"row {b}: an image of {t} frames: video positions are not supported")
            gh, gw = h // merge, w // merge
            hh, ww = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
            pos.append(torch.stack([torch.zeros(gh * gw, dtype=torch.long), hh.reshape(-1), ww.reshape(-1)]) + p)
            image += [True] * (gh * gw)
            i += gh * gw
            p += max(gh, gw)
            left = None if left is None else left - 1
        if pos:
            out[:, b, real] = torch.cat(pos, dim=1)[:, : len(ids)]
            filled[b, real] = torch.tensor(image[: len(ids)], dtype=torch.bool)
    return out, filled


def micro_batch_images(mb: dict, image_token_id: int, merge: int):
    """(3D positions [3, B, S], pixel values of the micro-batch's images [patches, D], their grids [images, 3],
    the mask [B, S] of the positions their features fill).

    A batch holds each row's images padded: ``pixel_values`` [B, P, D] (the row's patches first) and
    ``image_grid_thw`` [B, I, 3] (zero rows where a row has fewer images); a batch without them is text only."""
    ids, mask = mb["input_ids"], mb["attention_mask"]
    if "image_grid_thw" not in mb:  # text rows only
        mb = dict(mb, image_grid_thw=torch.zeros(ids.shape[0], 0, 3), pixel_values=torch.zeros(ids.shape[0], 0, 0))
    grids_by_row = mb["image_grid_thw"].long()
    pixels, grids = [], []
    for row in range(ids.shape[0]):
        real = grids_by_row[row][grids_by_row[row, :, 0] > 0]
        grids.append(real)
        pixels.append(mb["pixel_values"][row, : int(real.prod(-1).sum())])
    grid_thw = torch.cat(grids) if grids else torch.zeros(0, 3, dtype=torch.long)
    counts = [len(g) for g in grids]
    positions, filled = image_layout(ids.cpu(), mask.cpu(), image_token_id, grid_thw.cpu(), merge, counts)
    return positions.to(ids.device), torch.cat(pixels), grid_thw, filled.to(ids.device)


def interleaved_mrope(inv_freq: torch.Tensor, position_ids: torch.Tensor, mrope_section: Sequence[int]) -> torch.Tensor:
    """Qwen3-VL's rotary angles [S, B, 1, head_dim] from 3D positions [3, B, S]: frequency j turns with the
    height position when j = 1 (mod 3) and j < 3 * section_h, with the width when j = 2 (mod 3) and
    j < 3 * section_w, else with the temporal position (megatron-core's mrope cuts contiguous sections instead).

        angle_j = pos_{axis(j)} * inv_freq_j,   emb = [angle, angle]
    """
    freqs = position_ids.to(inv_freq.device).float()[..., None] * inv_freq.float()  # [3, B, S, head_dim / 2]
    angles = freqs[0].clone()
    for axis in (1, 2):
        pick = slice(axis, 3 * mrope_section[axis], 3)
        angles[..., pick] = freqs[axis][..., pick]
    return torch.cat([angles, angles], dim=-1).transpose(0, 1).unsqueeze(2).contiguous()
