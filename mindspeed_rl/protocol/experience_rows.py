"""An iteration's experience rows made from the rollout's outputs (the rows the scorer reads and the batch
trains on): prompts left-padded, responses right-padded, routes and images on the same grid."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..datasets.padding import left_pad
from .experience import Experience
from .rollout import RolloutOutput, by_prompt


def build_experience(
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[RolloutOutput],
    n: int,
    pad_id: int,
    labels: Optional[Sequence[str]] = None,
    version: int = 0,
    images: Optional[Sequence[bytes]] = None,
) -> Experience:
    """Rows prompt by prompt (n responses each): left-padded prompt + right-padded response.

    ``outputs`` carry global prompt indices (any order); each prompt must have exactly n of them. ``prompts``: one
    per prompt, or one per output in prompt order (the n responses of a prompt read different prompts). Tokens
    of an output without per-token versions were sampled by policy ``version``; its ``loss_mask`` (tool
    results 0) becomes the row's, all 1 without one. ``images``: each prompt's stored images (b"" for none)
    for a vision-language model, one bytes object shared by the prompt's n rows.
    """
    grouped = by_prompt(outputs)
    per_row = len(prompts) == len(outputs) and n > 1
    groups = len(prompts) // n if per_row else len(prompts)
    rows: List[Tuple[Sequence[int], RolloutOutput]] = []
    for i in range(groups):
        got = grouped.get(i, [])
        if len(got) != n:
            raise RuntimeError(f"prompt {i}: {len(got)} responses, expected {n}")
        rows += [(prompts[i * n + k] if per_row else prompts[i], o) for k, o in enumerate(got)]
    prompt_ids, prompt_mask = left_pad([r[0] for r in rows], pad_id)
    width = max(1, max(len(o.response_ids) for _, o in rows))
    response_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(rows), width), dtype=torch.long)
    rollout_log_probs = torch.zeros((len(rows), width), dtype=torch.float32)
    policy_version = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, (_, out) in enumerate(rows):
        if out.response_ids:
            length = len(out.response_ids)
            response_ids[b, :length] = torch.tensor(out.response_ids, dtype=torch.long)
            response_mask[b, :length] = 1
            rollout_log_probs[b, :length] = torch.tensor(out.logprobs, dtype=torch.float32)
            policy_version[b, :length] = torch.tensor(out.versions, dtype=torch.long) if out.versions else version
            loss_mask[b, :length] = torch.tensor(out.loss_mask, dtype=torch.long) if out.loss_mask else 1
    return Experience(
        prompt_width=int(prompt_ids.shape[1]),
        routed_experts=routes_on_grid(rows, int(prompt_ids.shape[1]), width),
        input_ids=torch.cat([prompt_ids, response_ids], 1),
        attention_mask=torch.cat([prompt_mask, response_mask], 1),
        response_mask=response_mask,
        loss_mask=loss_mask,
        policy_version=policy_version,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        rollout_log_probs=rollout_log_probs,
        group=torch.arange(len(rows)) // n,
        labels=None if labels is None else [labels[i // n] for i in range(len(rows))],
        images=None if images is None else [images[i // n] for i in range(len(rows))],
    ).validate()


def routes_on_grid(rows, prompt_width: int, response_width: int) -> Optional[torch.Tensor]:
    """The rows' routed experts (router replay) on the [B, P+R] grid, or None when no output carries any.
    An output's routes cover its prompt and response from position 0; the prompt is left-padded to
    ``prompt_width``, so position j sits at column prompt_width - len(prompt) + j."""
    carried = [out.routed_experts for _, out in rows if out.routed_experts is not None]
    if not carried:
        return None
    layers, k = carried[0].shape[1:]
    grid = torch.full((len(rows), prompt_width + response_width, layers, k), -1, dtype=torch.int16)
    for b, (prompt, out) in enumerate(rows):
        if out.routed_experts is not None:
            routes = torch.as_tensor(out.routed_experts, dtype=torch.int16)
            start = prompt_width - len(prompt)
            grid[b, start : start + routes.shape[0]] = routes[: grid.shape[1] - start]
    return grid


def image_fields(per_row: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """``pixel_values`` [B, V, D] and ``image_grid_thw`` [B, I, 3] (IMAGE_INPUTS, zeros after a row's own) from each
    row's (pixel values [P, D], grids [I, 3]); empty when no row has an image."""
    if not any(grids.shape[0] for _, grids in per_row):
        return {}
    width = max(pixels.shape[1] for pixels, _ in per_row if pixels.numel())
    patches = max(1, max(pixels.shape[0] for pixels, _ in per_row))
    images = max(1, max(grids.shape[0] for _, grids in per_row))
    pixel_values = torch.zeros(len(per_row), patches, width)
    grid_thw = torch.zeros(len(per_row), images, 3, dtype=torch.long)
    for row, (pixels, grids) in enumerate(per_row):
        if grids.shape[0]:
            pixel_values[row, : pixels.shape[0]] = pixels
            grid_thw[row, : grids.shape[0]] = grids
    return {"pixel_values": pixel_values, "image_grid_thw": grid_thw}


__all__ = ["build_experience", "image_fields", "routes_on_grid"]
