"""The experience batch of one iteration: declared fields, their shapes, and the row operations
(select, split, concatenate) the driver uses to hand pieces of it to workers.

Row b is one response; rows are prompt-major (the n responses of prompt 0 first). Every row has
the same two-part layout, so one number (``prompt_width``) says where the response starts::

    input_ids  [B, P + R]  = [ left-padded prompt (P columns) | right-padded response (R columns) ]

Dimensions in the field table: B rows, P = prompt_width, R = response_width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..algorithms.losses import LossScale

Rows = Union[np.ndarray, Sequence[int], slice]


@dataclass(frozen=True)
class FieldSpec:
    dims: Tuple[str, ...]  # "B", "P", "R" or "P+R", then sizes of the field's own ("L", "K": any)
    dtype: torch.dtype
    doc: str


FIELDS: Dict[str, FieldSpec] = {
    "input_ids": FieldSpec(("B", "P+R"), torch.long, "prompt tokens (left-padded) then response tokens (right-padded)"),
    "attention_mask": FieldSpec(("B", "P+R"), torch.long, "1 on real prompt and response tokens, 0 on padding"),
    "prompt_mask": FieldSpec(("B", "P"), torch.long, "1 on real prompt tokens"),
    "response_ids": FieldSpec(("B", "R"), torch.long, "the generated tokens"),
    "response_mask": FieldSpec(("B", "R"), torch.long, "1 on every real response token (attention, lengths)"),
    "loss_mask": FieldSpec(
        ("B", "R"),
        torch.long,
        "1 on the response tokens the policy generated: the positions "
        "every loss, normaliser and advantage counts (equal to "
        "response_mask for single-turn text; 0 on tool output)",
    ),
    "policy_version": FieldSpec(
        ("B", "R"), torch.long, "the policy version (updates applied) whose weights sampled each response token"
    ),
    "rollout_log_probs": FieldSpec(("B", "R"), torch.float32, "log p(token) under the rollout engine"),
    "group": FieldSpec(
        ("B",),
        torch.long,
        "index of the row's prompt in the iteration: the n responses of one prompt share it (GRPO groups)",
    ),
    "ref_log_probs": FieldSpec(("B", "R"), torch.float32, "log p(token) under the frozen reference"),
    "teacher_log_probs": FieldSpec(
        ("B", "R"), torch.float32, "log p(token) under the distillation teacher (temperature 1)"
    ),
    "old_log_probs": FieldSpec(
        ("B", "R"), torch.float32, "log p(token) under the actor before this iteration's updates"
    ),
    "values": FieldSpec(("B", "R"), torch.float32, "critic value of each response position"),
    "scores": FieldSpec(("B",), torch.float32, "sequence score (rule verifiers and/or reward model)"),
    "episode_rewards": FieldSpec(("B",), torch.float32, "an outside agent's reward for the row (NaN: none posted)"),
    "kl": FieldSpec(("B", "R"), torch.float32, "per-token KL(actor || reference) estimate, 0 on padding"),
    "token_rewards": FieldSpec(
        ("B", "R"), torch.float32, "score on the last response token, minus KL when it is in the reward"
    ),
    "advantages": FieldSpec(("B", "R"), torch.float32, "advantage of each response token"),
    "rollout_is_weights": FieldSpec(
        ("B", "R"),
        torch.float32,
        "rollout-correction importance weight of each response token (rollout_correction.rollout_is)",
    ),
    "returns": FieldSpec(("B", "R"), torch.float32, "value target of each response token"),
    "routed_experts": FieldSpec(
        ("B", "P+R", "L", "K"),
        torch.int16,
        "router replay: the experts the rollout engine routed each token to, per MoE layer (L) and choice (K); "
        "-1 where it routed none (padding, the last token)",
    ),
}
FREE_DIMS = ("L", "K")  # sized by the field itself
PAD_FILL = {"input_ids": None, "response_ids": None, "routed_experts": -1}  # None: the pad id; others 0

# what a worker decodes from a vision-language row's ``images`` for the model (workers/base_worker.model_inputs):
# pixel values [B, V, D] (the row's patches first) and the (t, h, w) grid of each image [B, I, 3]
IMAGE_INPUTS = ("pixel_values", "image_grid_thw")
MODEL_INPUTS = ("input_ids", "attention_mask", "response_mask", "loss_mask")
ACTOR_INPUTS = MODEL_INPUTS + ("routed_experts",)  # the actor's forwards replay the rollout's routes (R3)


@dataclass
class Experience:
    """Named tensors of the FIELDS table (absent ones are None), plus per-row labels and images.

    ``prompt_width`` (P) is the number of prompt columns of ``input_ids``: the response of every
    row starts at column P. ``images``: a vision-language row's prompt images as stored (datasets/images.py
    ``pack_images``; b"" for none), the same bytes object for every row of a prompt, so that Ray sends them once
    per prompt; the worker that runs the model turns them into pixels.
    """

    prompt_width: int
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    loss_mask: Optional[torch.Tensor] = None  # defaults to response_mask
    policy_version: Optional[torch.Tensor] = None
    prompt_mask: Optional[torch.Tensor] = None
    response_ids: Optional[torch.Tensor] = None
    rollout_log_probs: Optional[torch.Tensor] = None
    group: Optional[torch.Tensor] = None
    ref_log_probs: Optional[torch.Tensor] = None
    teacher_log_probs: Optional[torch.Tensor] = None
    old_log_probs: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    scores: Optional[torch.Tensor] = None
    episode_rewards: Optional[torch.Tensor] = None
    kl: Optional[torch.Tensor] = None
    token_rewards: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    rollout_is_weights: Optional[torch.Tensor] = None
    returns: Optional[torch.Tensor] = None
    routed_experts: Optional[torch.Tensor] = None
    labels: Optional[List[str]] = field(default=None, repr=False)
    images: Optional[List[bytes]] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.response_mask.clone()

    # ----- shape -----------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_width(self) -> int:
        return int(self.response_mask.shape[1])

    def present(self) -> List[str]:
        """Names of the tensor fields that are set."""
        return [name for name in FIELDS if getattr(self, name) is not None]

    def expected_shape(self, name: str, tensor: Optional[torch.Tensor] = None) -> Tuple[int, ...]:
        """The shape field ``name`` must have (its own dims, FREE_DIMS, as ``tensor`` has them)."""
        sizes = {
            "B": self.num_rows,
            "P": self.prompt_width,
            "R": self.response_width,
            "P+R": self.prompt_width + self.response_width,
        }
        dims = FIELDS[name].dims
        return tuple(
            tensor.shape[i] if d in FREE_DIMS and tensor is not None and tensor.dim() == len(dims) else sizes.get(d, -1)
            for i, d in enumerate(dims)
        )

    def set(self, name: str, tensor: torch.Tensor) -> None:
        """Set a field, checking its declared shape (the guard against misaligned columns)."""
        if name not in FIELDS:
            raise KeyError(f"experience has no field {name!r}; fields: {', '.join(FIELDS)}")
        self._check_shape(name, tensor)
        setattr(self, name, tensor.to(FIELDS[name].dtype))

    def _check_shape(self, name: str, tensor: torch.Tensor) -> None:
        want = self.expected_shape(name, tensor)
        if tuple(tensor.shape) != want:
            raise ValueError(
                f"experience field {name}: shape {tuple(tensor.shape)}, expected {want} "
                f"({' x '.join(FIELDS[name].dims)})"
            )

    def validate(self) -> "Experience":
        for name in self.present():
            self._check_shape(name, getattr(self, name))
        for name in ("labels", "images"):
            values = getattr(self, name)
            if values is not None and len(values) != self.num_rows:
                raise ValueError(f"experience {name}: {len(values)} for {self.num_rows} rows")
        return self

    # ----- rows ------------------------------------------------------------------------------------
    def select(self, rows: Optional[Rows] = None, fields: Optional[Iterable[str]] = None) -> "Experience":
        """The given rows (all when None) with the given fields (all present ones when None); the model
        inputs are always kept. Tensors are copies, safe to send through the object store."""
        keep = set(MODEL_INPUTS) | set(self.present() if fields is None else fields)
        index = rows if rows is None or isinstance(rows, slice) else torch.as_tensor(np.asarray(rows), dtype=torch.long)
        values = {}
        for name in FIELDS:
            tensor = getattr(self, name)
            if tensor is None or name not in keep:
                continue
            values[name] = (tensor if index is None else tensor[index]).clone()
        picked = (
            range(self.num_rows)[rows]
            if isinstance(rows, slice)
            else (range(self.num_rows) if rows is None else [int(r) for r in rows])
        )
        labels = [self.labels[i] for i in picked] if self.labels is not None and fields is None else None
        images = [self.images[i] for i in picked] if self.images is not None else None  # a model input
        return Experience(prompt_width=self.prompt_width, labels=labels, images=images, **values)

    def split(self, parts: int, fields: Optional[Iterable[str]] = None) -> List["Experience"]:
        """``parts`` contiguous, equal pieces (data-parallel shares)."""
        return [self.select(rows, fields) for rows in split_rows(self.num_rows, parts)]

    def tensors(self, names: Iterable[str] = MODEL_INPUTS) -> Dict[str, torch.Tensor]:
        """Plain name -> tensor mapping of the given present fields (what the Megatron engine consumes)."""
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def tight(self) -> "Experience":
        """The same rows without the columns that are padding in every row (the left of the prompts, the right
        of the responses): a piece as wide as its own rows need."""
        prompt_mask = self.attention_mask[:, : self.prompt_width]
        left = self.prompt_width - int(prompt_mask.sum(1).max()) if self.num_rows else 0
        width = max(1, int(self.response_mask.sum(1).max())) if self.num_rows else self.response_width
        keep = {"P": slice(left, None), "R": slice(0, width), "P+R": slice(left, self.prompt_width + width)}
        values = {}
        for name in self.present():
            tensor, token_dims = getattr(self, name), [d for d in FIELDS[name].dims if d in keep]
            values[name] = tensor[:, keep[token_dims[0]]] if token_dims else tensor
        return Experience(prompt_width=self.prompt_width - left, labels=self.labels, images=self.images, **values)

    def widened(self, prompt_width: int, response_width: int, pad_id: int) -> "Experience":
        """The same rows with more prompt columns (padding added on the left) and response columns (on
        the right); padding is ``pad_id`` in token fields and 0 elsewhere."""
        left, right = prompt_width - self.prompt_width, response_width - self.response_width
        if left < 0 or right < 0:
            raise ValueError(
                f"cannot narrow experience from P={self.prompt_width}, R={self.response_width} "
                f"to P={prompt_width}, R={response_width}"
            )
        values = {}
        for name in self.present():
            tensor, dims = getattr(self, name), FIELDS[name].dims
            fill = PAD_FILL.get(name, 0)
            fill = pad_id if fill is None else fill
            token_axis = [d for d in dims if d not in ("B",) + FREE_DIMS]
            pad = {"P": (left, 0), "R": (0, right), "P+R": (left, right)}[token_axis[0]] if token_axis else (0, 0)
            if pad != (0, 0):  # F.pad lists the last dim first: the free dims after the token axis get (0, 0)
                trailing = (0, 0) * (len(dims) - 1 - dims.index(token_axis[0]))
                tensor = torch.nn.functional.pad(tensor, trailing + pad, value=fill)
            values[name] = tensor
        return Experience(prompt_width=prompt_width, labels=self.labels, images=self.images, **values)

    @staticmethod
    def cat(parts: Sequence["Experience"], pad_id: Optional[int] = None) -> "Experience":
        """Rows of ``parts`` in order; every part has the same fields. With ``pad_id``, parts of different
        widths are widened to the widest first; without it their widths must agree."""
        first = parts[0]
        if any(p.present() != first.present() for p in parts[1:]):
            raise ValueError("cannot concatenate experience pieces with different fields")
        if pad_id is not None:
            width_p, width_r = max(p.prompt_width for p in parts), max(p.response_width for p in parts)
            parts = [p.widened(width_p, width_r, pad_id) for p in parts]
            first = parts[0]
        elif any((p.prompt_width, p.response_width) != (first.prompt_width, first.response_width) for p in parts):
            raise ValueError("cannot concatenate experience pieces of different widths without a pad_id")
        values = {name: cat_rows([getattr(p, name) for p in parts], name) for name in first.present()}
        labels = [x for p in parts for x in (p.labels or [])] if all(p.labels is not None for p in parts) else None
        images = None  # a text prompt among image prompts: b"", no images
        if any(p.images is not None for p in parts):
            images = [x for p in parts for x in (p.images if p.images is not None else [b""] * p.num_rows)]
        return Experience(prompt_width=first.prompt_width, labels=labels, images=images, **values)


@dataclass
class MiniBatch:
    """One optimizer step's rows for one DP rank, and the counts of the whole mini-batch (all DP ranks):
    the loss normalisers that make the loss independent of how the mini-batch is split."""

    rows: Experience
    scale: LossScale


def cat_rows(tensors: Sequence[torch.Tensor], name: str) -> torch.Tensor:
    """Rows of a field's pieces; free dims that differ (images of other sizes) are padded to the largest."""
    widest = [max(sizes) for sizes in zip(*(t.shape for t in tensors))]
    fill = PAD_FILL.get(name, 0) or 0
    padded = []
    for t in tensors:
        pad = [x for dim in reversed(range(1, t.dim())) for x in (0, widest[dim] - t.shape[dim])]
        padded.append(torch.nn.functional.pad(t, pad, value=fill) if any(pad) else t)
    return torch.cat(padded)


def split_rows(num_rows: int, parts: int) -> List[np.ndarray]:
    if num_rows % parts:
        raise ValueError(f"{num_rows} rows do not split over {parts} data-parallel ranks")
    return np.array_split(np.arange(num_rows), parts)


def mini_batch_plan(num_rows: int, mini_batch_size: int, epochs: int, shuffle: bool, seed: int) -> List[np.ndarray]:
    """Row indices of every optimizer step: epochs x (num_rows / mini_batch_size) mini-batches."""
    plan = []
    for epoch in range(epochs):
        order = np.random.RandomState(seed + epoch).permutation(num_rows) if shuffle else np.arange(num_rows)
        plan += [order[i : i + mini_batch_size] for i in range(0, num_rows, mini_batch_size)]
    return plan


def response_part(per_token: torch.Tensor, prompt_width: int, response_width: int) -> torch.Tensor:
    """The response columns of a per-token tensor of the whole (prompt + response) sequence."""
    return per_token[:, prompt_width : prompt_width + response_width]


__all__ = [
    "FIELDS",
    "IMAGE_INPUTS",
    "MODEL_INPUTS",
    "Experience",
    "FieldSpec",
    "MiniBatch",
    "split_rows",
    "mini_batch_plan",
    "response_part",
]
