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


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check(cfg: PPOConfig) -> None:
    """multi_turn_enable selects the tool agent, so it cannot be combined with another rollout function (the
    names themselves resolve in trainer/startup/config_names.py). openai_agent: one harness, either an entry point
    or a command; an endpoint on an address other than loopback only with a bearer token."""
    rl = cfg.rl
    if rl.multi_turn_enable and rl.rollout_function not in ("single_turn", "tool_agent"):
        raise ConfigError(
            "rl_config.multi_turn_enable", f"selects tool_agent, but rollout_function is {rl.rollout_function!r}"
        )
    if agent_rollout_function(rl) != "openai_agent":
        return
    keys = rl.policy_endpoint
    if bool(keys.entry_point) == bool(keys.command):
        raise ConfigError(
            "rl_config.policy_endpoint.entry_point",
            "openai_agent runs one harness per episode: give entry_point ('module:function') or command, not "
            + ("both" if keys.entry_point else "neither"),
        )
    if keys.shared_harness and not keys.command:
        raise ConfigError(
            "rl_config.policy_endpoint.shared_harness", "runs the command once for all episodes: give command"
        )
    if keys.host not in LOOPBACK and not keys.api_key:
        raise ConfigError(
            "rl_config.policy_endpoint.api_key",
            f"the endpoint listens on {keys.host}, beyond this machine: set a bearer token (or host 127.0.0.1)",
        )


def plan_lines(cfg: PPOConfig) -> List[str]:
    rl = cfg.rl
    agent = agent_rollout_function(rl)
    if agent == "single_turn":
        return []
    if agent == "openai_agent":
        keys = rl.policy_endpoint
        harness = f"entry point {keys.entry_point}" if keys.entry_point else f"command {keys.command!r}"
        harness += " once for all episodes" if keys.shared_harness else " per episode"
        return [
            f"  agent     : rollout function openai_agent: an OpenAI-compatible endpoint on {keys.host} port "
            f"{keys.port or '(a free one)'} ({'bearer token' if keys.api_key else 'no token'}), {harness}, "
            f"up to {rl.agent.max_turns} turns within max_tokens; the harness's messages loss_mask 0; an "
            f"episode silent {keys.harness_timeout_s:g} s"
            + (" or without a reward" if keys.require_reward else "")
            + " is dropped with its group"
        ]
    tools = ", ".join(rl.tools) + (f" + {rl.tool_config_path}" if rl.tool_config_path else "")
    return [
        f"  agent     : rollout function {agent}, tools [{tools}], up to {rl.agent.max_turns} turns and "
        f"{rl.agent.max_tool_calls} calls per trajectory within max_tokens; tool results loss_mask 0; "
        f"sandbox {rl.sandbox.isolation} ({rl.sandbox.timeout:g} s wall, {rl.sandbox.cpu_seconds} s CPU, "
        f"{rl.sandbox.memory_mb} MB, scratch {rl.sandbox.scratch_mb} MB)"
    ]
