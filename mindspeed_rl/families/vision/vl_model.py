"""A megatron-core GPTModel that takes images: the family's vision tower attached to the first pipeline
stage's GPTModel (``gpt.visual``), its image tokens spliced into the input embeddings.

    e = Embed(input_ids);  e[input_ids == image_token] = Tower(pixel_values, image_grid_thw)
    output = GPT(decoder_input = e, position_ids = 3D rotary positions [3, B, S])
    h_k[image positions] += deep_k      (DeepStack towers: after language-model layer k, k < len(deep))

Attached rather than wrapped: the model keeps GPTModel's names (``embedding.*``, ``decoder.*``, ``output_layer``,
and ``visual.*`` beside them, the converters' layout) and everything that handles a GPTModel (DDP, the
optimizer, the LoRA and head patches, checkpoints) handles it unchanged. The tower is replicated over TP
ranks. With sequence parallelism the splice happens on the whole sequence, then each rank keeps its share of
the positions (``embed_with_images``); DeepStack's additions are split the same way. DeepStack's layers
must sit on the first pipeline stage, and full activation recompute would replay them without the features
(refused by the configuration rules).
"""

from __future__ import annotations

import contextlib
import types
from typing import List, Optional, Tuple

import torch


def attach_vision_tower(gpt, tower: torch.nn.Module, image_token_id: int) -> None:
    """Give a first-stage GPTModel the family's ``tower`` and an image-taking forward (later stages: nothing)."""
    if not getattr(gpt, "pre_process", True):
        return
    gpt.visual = tower.to(device=next(gpt.parameters()).device, dtype=next(gpt.parameters()).dtype)
    gpt.image_token_id = int(image_token_id)
    gpt.forward = types.MethodType(_forward_with_images, gpt)


@contextlib.contextmanager
def deepstack_added(gpt, where: torch.Tensor, deep: List[torch.Tensor]):
    """While inside: language-model layer k's output gets ``deep[k]`` added at the image positions ``where``
    [B, S] (row-major, as the features were spliced), for k < len(deep)."""
    layers = gpt.decoder.layers
    if len(deep) > len(layers):
        raise ValueError(f"{len(deep)} DeepStack features but the first pipeline stage holds {len(layers)} layers")

    def add(k):
        def hook(module, args, output):
            hidden, context = output  # [S, B, H]; with sequence parallelism [S / TP, B, H]
            full = hidden.new_zeros(where.shape[1], where.shape[0], hidden.shape[-1])
            extra = full.transpose(0, 1).masked_scatter(where.unsqueeze(-1), deep[k]).transpose(0, 1)
            if gpt.config.sequence_parallel:
                from megatron.core import tensor_parallel

                extra = tensor_parallel.scatter_to_sequence_parallel_region(extra.contiguous())
            return hidden + extra.to(hidden.dtype), context

        return hook

    handles = [layers[k].register_forward_hook(add(k)) for k in range(len(deep))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


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
    where = input_ids == gpt.image_token_id if image_mask is None else image_mask
    out = gpt.visual(pixel_values, image_grid_thw)
    features, deep = out if isinstance(out, tuple) else (out, [])
    if int(where.sum()) != features.shape[0]:
        raise ValueError(f"{int(where.sum())} image placeholder tokens but the images give {features.shape[0]} tokens")
    decoder_input = embed_with_images(gpt, input_ids, where, features)
    with deepstack_added(gpt, where, [d.to(decoder_input.dtype) for d in deep]):
        return plain(gpt, None, position_ids, attention_mask, decoder_input=decoder_input, **kwargs)


def embed_with_images(gpt, input_ids: torch.Tensor, where: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The decoder's input [S, B, H]: token embeddings with ``features`` at ``where`` [B, S]. With sequence
    parallelism the whole sequence is embedded (the word embeddings all-reduced instead of reduce-scattered),
    spliced, then scattered: each TP rank keeps its share of the positions, as megatron's embedding gives it."""
    from megatron.core import tensor_parallel

    embedding = gpt.embedding
    if not gpt.config.sequence_parallel:
        embedded = embedding(input_ids=input_ids, position_ids=None).transpose(0, 1)  # [B, S, H]
        return embedded.masked_scatter(where.unsqueeze(-1), features.to(embedded.dtype)).transpose(0, 1).contiguous()
    words = embedding.word_embeddings
    scatters, words.reduce_scatter_embeddings = words.reduce_scatter_embeddings, False
    try:
        embedded = words(input_ids)  # [B, S, H] on every TP rank
    finally:
        words.reduce_scatter_embeddings = scatters
    embedded = embedded.masked_scatter(where.unsqueeze(-1), features.to(embedded.dtype)).transpose(0, 1)
    local = tensor_parallel.scatter_to_sequence_parallel_region(embedded.contiguous())
    with tensor_parallel.get_cuda_rng_tracker().fork():
        return embedding.embedding_dropout(local)


def vision_of(model, remove_padding: bool, cp: int) -> Optional[Tuple[int, int]]:
    """(image token id, spatial merge) of a vision-language model, None for a text model; refuses the layouts
    whose positions the vision path cannot give yet."""
    if not model.vision_config:
        return None
    from ...compat.megatron_core import packed_positions_unavailable

    if cp > 1:
        raise ValueError(
            "vision-language models: context parallelism splits image tokens from their 3D positions; "
            "set context_parallel_size 1"
        )
    why = packed_positions_unavailable() if remove_padding else ""
    if why:
        raise ValueError(f"vision-language models with use_remove_padding: {why}; set it false")
    return int(model.image_token_id), int(model.vision_config.get("spatial_merge_size", 2))


PROJECTORS = ("merger.", "deepstack_merger_list.")


def freeze_vision(gpt, tower: bool, projector: bool) -> int:
    """Stop the vision tower's blocks, patch and position embeddings (``tower``) and/or its projectors, the
    patch merger and DeepStack's mergers (``projector``), from training; returns the number of parameters frozen."""
    frozen = 0
    for name, param in getattr(gpt, "visual", torch.nn.Module()).named_parameters():
        if (projector if name.startswith(PROJECTORS) else tower) and param.requires_grad:
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen
