"""``rl_config.policy_endpoint``: the OpenAI-compatible endpoint outside agents talk to, and the harness started per
episode (rollout_function openai_agent; docs/agents.md, "Agents from outside")."""

from __future__ import annotations

from dataclasses import dataclass

from .base import opt


@dataclass
class PolicyEndpointConfig:
    host: str = opt("127.0.0.1", "Address the endpoint listens on; any other than loopback needs api_key.")
    port: int = opt(0, "Its port (0: a free one; the run prints the address).", ge=0, le=65535)
    api_key: str = opt("", "Bearer token every request must carry (empty: none, on loopback only).")
    served_model_name: str = opt("policy", "The model name /v1/models lists and requests name.")
    max_body_bytes: int = opt(1048576, "A larger request body is refused (413).", ge=1024)
    entry_point: str = opt("", "The harness as 'module:function', called per episode in a driver thread.")
    command: str = opt("", "The harness as a shell command, one process per episode (the task on stdin).")
    shared_harness: bool = opt(
        False,
        "The command runs once for all episodes, each task a JSON line on its stdin; it ends an episode by "
        "posting its reward or POST /v1/episodes/{id}/end (environments that are slow to start).",
    )
    harness_timeout_s: float = opt(
        300.0,
        "Seconds the harness may take to call again (or post its reward, or exit) before its episode is "
        "dropped; a dropped episode's process is killed after as long.",
        gt=0,
    )
    require_reward: bool = opt(False, "An episode whose harness ends without posting a reward is dropped.")
