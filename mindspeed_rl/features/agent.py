"""The agent rollout: the rollout function in effect (MindSpeed-RL's multi_turn_enable selects tool_agent) and the
plan's line on its tools, turns and sandbox."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def agent_rollout_function(rl) -> str:
    """The rollout function in effect (MindSpeed-RL's multi_turn_enable selects tool_agent)."""
    return "tool_agent" if rl.multi_turn_enable and rl.rollout_function == "single_turn" else rl.rollout_function


def check(cfg: PPOConfig) -> None:
    """multi_turn_enable selects the tool agent, so it cannot be combined with another rollout function (the
    names themselves resolve in trainer/startup/config_names.py)."""
    rl = cfg.rl
    if rl.multi_turn_enable and rl.rollout_function not in ("single_turn", "tool_agent"):
        raise ConfigError(
            "rl_config.multi_turn_enable", f"selects tool_agent, but rollout_function is {rl.rollout_function!r}"
        )


def plan_lines(cfg: PPOConfig) -> List[str]:
    rl = cfg.rl
    agent = agent_rollout_function(rl)
    if agent == "single_turn":
        return []
    tools = ", ".join(rl.tools) + (f" + {rl.tool_config_path}" if rl.tool_config_path else "")
    return [
        f"  agent     : rollout function {agent}, tools [{tools}], up to {rl.agent.max_turns} turns and "
        f"{rl.agent.max_tool_calls} calls per trajectory within max_tokens; tool results loss_mask 0; "
        f"sandbox {rl.sandbox.isolation} ({rl.sandbox.timeout:g} s wall, {rl.sandbox.cpu_seconds} s CPU, "
        f"{rl.sandbox.memory_mb} MB, scratch {rl.sandbox.scratch_mb} MB)"
    ]
