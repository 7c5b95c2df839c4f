"""Which layers each pipeline rank holds: an uneven split (num_layer_list) or an interleaved pipeline (VPP,
virtual_pipeline_model_parallel_size / num_layers_per_virtual_pipeline_stage)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config_cls.base import ConfigError
from ..config_cls.run_config import role_key

if TYPE_CHECKING:
    from ..config_cls.run_config import RoleConfig


def check_role(role: "RoleConfig") -> None:
    """num_layer_list lists the ranks' layers, or PP divides them; then the interleaved pipeline's rules."""
    m, model = role.megatron, role.model
    try:
        layers = m.layers_per_stage(model.num_layers)
    except ValueError:
        layers = []
    if m.num_layer_list:
        if len(layers) != role.pp or sum(layers) != model.num_layers or min(layers) < 1:
            raise ConfigError(
                role_key(role, "num_layer_list"),
                f"{m.num_layer_list!r} must list {role.pp} positive layer counts summing to "
                f"num_layers {model.num_layers}",
            )
    elif model.num_layers % role.pp:
        raise ConfigError(
            role_key(role, "pipeline_model_parallel_size"),
            f"PP {role.pp} does not divide num_layers {model.num_layers}; set num_layer_list",
        )
    check_virtual_pipeline(role)


def check_virtual_pipeline(role: "RoleConfig") -> None:
    """An interleaved pipeline: PP > 1, equal virtual stages, and none of the features not run with it."""
    m, layers = role.megatron, role.model.num_layers
    if m.virtual_pipeline_model_parallel_size and m.num_layers_per_virtual_pipeline_stage:
        raise ConfigError(
            role_key(role, "num_layers_per_virtual_pipeline_stage"),
            "and virtual_pipeline_model_parallel_size say the same thing: give one",
        )
    key = role_key(
        role,
        "num_layers_per_virtual_pipeline_stage"
        if m.num_layers_per_virtual_pipeline_stage
        else "virtual_pipeline_model_parallel_size",
    )
    per = m.num_layers_per_virtual_pipeline_stage
    if per and (layers // max(role.pp, 1)) % per:
        raise ConfigError(key, f"{per} does not divide the {layers // role.pp} layers of a pipeline rank")
    vpp = m.virtual_stages(layers)
    if vpp == 1:
        return
    if role.pp < 2:
        raise ConfigError(key, f"an interleaved pipeline needs pipeline_model_parallel_size > 1 (PP {role.pp})")
    if m.num_layer_list:
        raise ConfigError(key, "with num_layer_list: the virtual stages are equal (remove num_layer_list)")
    if layers % (role.pp * vpp):
        raise ConfigError(key, f"PP {role.pp} x VPP {vpp} does not divide num_layers {layers}")
    for feature, on in (("lora_r", m.lora_r), ("vision", role.model.vision_config)):
        if on:
            raise ConfigError(key, f"VPP {vpp} with {feature}: not supported yet (use PP without VPP)")
