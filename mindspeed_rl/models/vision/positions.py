"""Where image tokens sit: the tower's 2D patch positions and attention windows, the language model's 3D
(temporal, height, width) rotary positions.

Patches arrive block-major: each spatial_merge x spatial_merge block of neighbouring patches is contiguous,
because the merger concatenates a block into one language-model token.
"""

from __future__ import annotations

from typing import List, Tuple

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
    batch, seq = input_ids.shape
    out = torch.zeros(3, batch, seq, dtype=torch.long)
    grids = iter(grid_thw.tolist())
    for b in range(batch):
        real = attention_mask[b].bool()
        ids = input_ids[b][real].tolist()
        pos: List[torch.Tensor] = []
        p, i = 0, 0
        while i < len(ids):
            if ids[i] != image_token_id:
                j = i
                while j < len(ids) and ids[j] != image_token_id:
                    j += 1
                pos.append(torch.arange(p, p + j - i).expand(3, -1))
                p += j - i
                i = j
                continue
            t, h, w = next(grids)
            if t != 1:
                raise ValueError(f"row {b}: an image of {t} frames: video positions are not supported")
            gh, gw = h // merge, w // merge
            hh, ww = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
            pos.append(torch.stack([torch.zeros(gh * gw, dtype=torch.long), hh.reshape(-1), ww.reshape(-1)]) + p)
            i += gh * gw
            p += max(gh, gw)
        out[:, b, real] = torch.cat(pos, dim=1) if pos else out[:, b, real]
    return out


def micro_batch_images(mb: dict, image_token_id: int, merge: int):
    """(3D positions [3, B, S], pixel values of the micro-batch's images [patches, D], their grids [images, 3]).

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
    positions = mrope_positions(ids.cpu(), mask.cpu(), image_token_id, grid_thw.cpu(), merge).to(ids.device)
    return positions, torch.cat(pixels), grid_thw
