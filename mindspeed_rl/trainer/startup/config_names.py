"""A config's names checked against the registries that own them: model families, chat templates, verifiers,
rollout functions and tools (built-in names and plug-in paths, which are imported here).

``config_cls`` checks the structure and the rules between keys without importing the layers above it; the
entry points call :func:`load_run_config` (or :func:`check_dataset_names`), which adds these checks, before
anything heavy starts. Every error is a ConfigError naming the key (exit 2). The owners are imported on use
(families and rollout functions import torch): a config that load_ppo_config refuses stops before that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Mapping, Optional, Sequence

from ...accelerator.detect import forced_device_kind
from ...config_cls.base import ConfigError, closest_key
from ...config_cls.model_config import ModelConfig
from ...config_cls.ppo_config import PPOConfig, build_model_section
from ...datasets.dataset_config import DatasetConfig
from ...features import load_ppo_config
from ...features.agent import agent_rollout_function
from .precision import settle_run_precision

if TYPE_CHECKING:
    from ...tools.registry import ToolSpec


def load_run_config(config_name: str, overrides: Sequence[str] = (), config_dir: Optional[str] = None) -> PPOConfig:
    """The run config loaded and checked (load_ppo_config), then its names resolved and its precision settled."""
    cfg = load_ppo_config(config_name, overrides, config_dir)
    check_run_names(cfg)
    forced_device_kind()  # MINDSPEED_RL_DEVICE names a kind (its device is checked when the run starts)
    settle_run_precision(cfg)
    return cfg


def check_run_names(cfg: PPOConfig) -> None:
    """Each role's model against its family, the rollout function and its tools, the rule verifiers."""
    for role in cfg.roles:
        check_model_family(role.model, f"model.{role.megatron.model}")
    check_agent_names(cfg)
    check_verifier_names(cfg)


def build_checked_model(data: Mapping, key: str) -> ModelConfig:
    """A model section read alone (``build_model_section``) and checked against its family."""
    model = build_model_section(data, key)
    check_model_family(model, key)
    return model


def check_model_family(model: ModelConfig, key: str) -> None:
    """A model section against what its family requires (e.g. Qwen3's qk_layernorm)."""
    from ...families import get_family

    get_family(model.model_type_hf).check(model, key)


def check_agent_names(cfg: PPOConfig) -> None:
    """The rollout function resolves; a whole-batch function runs without partial rollout; the tool agent has
    tools that resolve and a template with a tool role."""
    from ...datasets.templates import ToolFormat, load_templates
    from ...rollout.source.agent_loop import is_whole_batch, rollout_function
    from ...tools.registry import ToolConfigError, resolve_tools

    rl = cfg.rl
    name = agent_rollout_function(rl)
    try:
        function = rollout_function(name)
    except (ValueError, ToolConfigError) as exc:
        raise ConfigError("rl_config.rollout_function", str(exc)) from None
    if name == "single_turn":
        return
    if rl.partial_rollout_max_split > 1 and is_whole_batch(function):
        raise ConfigError(
            "rl_config.partial_rollout_max_split",
            f"the rollout function {name!r} is a whole-batch function (fn(request, context)): it cannot stop at a "
            "chunk's end and continue later; write it as a RolloutFunction class (docs/agents.md) for partial rollout",
        )
    if name == "openai_agent" and rl.policy_endpoint.entry_point:
        from ...rollout.endpoint.harness import import_entry_point

        try:
            import_entry_point(rl.policy_endpoint.entry_point)
        except ToolConfigError as exc:
            raise ConfigError("rl_config.policy_endpoint.entry_point", str(exc)) from None
    if name != "tool_agent":
        return
    try:
        tools = resolve_tools(rl.tools, rl.tool_config_path)
    except ToolConfigError as exc:
        raise ConfigError("rl_config.tools", str(exc)) from None
    if not tools:
        raise ConfigError("rl_config.tools", "the tool_agent rollout needs tools (or a tool_config_path)")
    templates = load_templates()
    if rl.prompt_type not in templates:
        raise ConfigError("rl_config.prompt_type", f"{rl.prompt_type!r} is not in configs/model/templates.json")
    try:
        ToolFormat.of_template(templates[rl.prompt_type], rl.prompt_type)
    except ValueError as exc:
        raise ConfigError("rl_config.prompt_type", str(exc)) from None


def check_verifier_names(cfg: PPOConfig) -> None:
    """Each rule verifier is a registered name or a plug-in path that imports."""
    from ...rewards.registry import VerifierImportError, import_verifier, is_path, known_verifiers

    if not cfg.rl.rule_reward:
        return
    known = known_verifiers()
    for i, name in enumerate(cfg.rl.verifier_function):
        key = f"rl_config.verifier_function[{i}]"
        if is_path(name):
            try:
                import_verifier(name)
            except VerifierImportError as exc:
                raise ConfigError(key, f"{name!r}: {exc}") from None
        elif name not in known:
            hint = closest_key(name, known)
            raise ConfigError(
                key,
                f"unknown verifier {name!r}"
                + (f"; did you mean {hint!r}?" if hint else "")
                + f"; registered: {', '.join(sorted(known))}",
            )


def check_dataset_names(cfg: DatasetConfig) -> Dict[str, ToolSpec]:
    """A dataset config's chat template and tools; returns name -> ToolSpec of the tools its prompts list."""
    from ...datasets.templates import load_templates, template_names
    from ...tools.registry import ToolConfigError, resolve_tools

    if cfg.prompt_type not in template_names():
        raise ConfigError(
            "prompt_type",
            f"{cfg.prompt_type!r} is not in configs/model/templates.json ({', '.join(template_names())})",
        )
    if not (cfg.tools or cfg.tool_config_path):
        return {}
    try:
        tools = resolve_tools(cfg.tools, cfg.tool_config_path, where="tools")
    except ToolConfigError as exc:
        raise ConfigError("tools", str(exc)) from None
    if "tools_format" not in load_templates()[cfg.prompt_type]:
        raise ConfigError(
            "prompt_type",
            f"{cfg.prompt_type!r} cannot list tools (no tools_format in configs/model/templates.json); "
            "with tools use e.g. qwen",
        )
    return tools
