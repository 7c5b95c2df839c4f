"""Typed data that crosses Ray between the single controller and the workers."""

from .experience import (
    ACTOR_INPUTS,
    FIELDS,
    IMAGE_INPUTS,
    MODEL_INPUTS,
    Experience,
    FieldSpec,
    MiniBatch,
    mini_batch_plan,
    response_part,
    split_rows,
)
from .experience_rows import build_experience
from .rollout import (
    ForwardAnswer,
    GeneratedBatch,
    LoadedState,
    RankLayout,
    RolloutOutput,
    RolloutRequest,
    RolloutResult,
    WorldSpec,
    by_prompt,
    slowest,
)

__all__ = [
    "ACTOR_INPUTS",
    "FIELDS",
    "IMAGE_INPUTS",
    "MODEL_INPUTS",
    "Experience",
    "FieldSpec",
    "ForwardAnswer",
    "GeneratedBatch",
    "LoadedState",
    "MiniBatch",
    "RankLayout",
    "RolloutOutput",
    "RolloutRequest",
    "RolloutResult",
    "WorldSpec",
    "build_experience",
    "by_prompt",
    "mini_batch_plan",
    "response_part",
    "slowest",
    "split_rows",
]
