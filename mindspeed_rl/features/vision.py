"""A vision-language actor: its image tokens keep their 3D rotary positions (no CP split), DeepStack's layers sit on
the first pipeline stage and are never replayed by a full recompute, and its prompts' images need vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from ..config_cls.run_config import role_key

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig, RoleConfig


def check(cfg: PPOConfig) -> None:
    """A vision-language actor's 3D rotary positions: no CP split of image tokens, DeepStack's layers on the first
    stage and never replayed by a full recompute; its prompts' images need vLLM to generate."""
    if not cfg.actor.model.vision_config:
        return
    model = cfg.actor.megatron.model
    for role in (r for r in cfg.roles if r.model.vision_config):
        if role.cp > 1:
            raise ConfigError(
                role_key(role, "context_parallel_size"),
                f"{role.cp}: the {role.name} is a vision-language model ({model}), whose image tokens a CP split "
                "would separate from their 3D positions; use 1",
            )
        check_deepstack(role, model)
    if cfg.generate.backend == "fallback":
        raise ConfigError(
            "generate_config.backend",
            f"fallback generates from text only; {model} takes images: use vllm (or auto with vLLM installed)",
        )


def check_deepstack(role: RoleConfig, model: str) -> None:
    """DeepStack (Qwen3-VL) adds image features to the outputs of the first k language-model layers, during the
    forward: those layers sit with the tower on the first pipeline stage, and are not replayed by full recompute."""
    k = len((role.model.vision_config or {}).get("deepstack_visual_indexes") or ())
    if not k:
        return
    if role.megatron.recompute_granularity == "full":
        raise ConfigError(
            role_key(role, "recompute_granularity"),
            f"full: {model}'s DeepStack adds image features to the first {k} layer(s) during the forward, which a full "
            "recompute would replay without them; use selective",
        )
    try:
        first = role.megatron.layers_per_stage(role.model.num_layers)[0]
    except ValueError:
        return  # a malformed num_layer_list: the parallel rules name it
    if first < k:
        raise ConfigError(
            role_key(role, "pipeline_model_parallel_size"),
            f"{role.pp}: the first stage holds {first} layers but {model}'s DeepStack feeds the first {k} (with the "
            "tower on that stage); give the first stage more layers or use a smaller PP",
        )
