"""The verifiers (0.4.0) calculator environment for many episodes in one long-lived process (``shared_harness``).

``verifiers_calculator_env.py`` starts a process per episode: importing verifiers (~4 s) plus, per rollout, a
calculator MCP server in a subprocess that imports verifiers again (~4 s). This process pays both once:

    rl_config.policy_endpoint.command: .venv-agents/bin/python examples/agents/verifiers_shared_calculator_env.py
    rl_config.policy_endpoint.shared_harness: true          (configs/grpo_tiny_cpu_verifiers.yaml)

It reads episode tasks as JSON lines on standard input (an ``EpisodeTask``: ``episode_id``, ``base_url`` (the
episode's own), ``api_key``, ``model``, ``messages``, ``label``, ...), runs each as an asyncio task (at most
``max_concurrent`` at once: an optional argument, at least the episodes of a batch, whose first requests the
trainer waits for together), posts each reward to ``{base_url}/reward`` (an episode that failed: ``{base_url}/end``,
so that the trainer drops it at once) and prints one line per episode (``id reward seconds stop errors``); it exits
when standard input closes and the running episodes are done.

Shared for the whole process -- what verifiers' own ``Env.serving`` shares across an eval's rollouts:

  * the calculator: ONE tool server (``verifiers.v1.mcp.serve_shared``, verifiers' taskset-scoped server: one
    subprocess), handed to every run as ``agent.run(task, tools=shared)``; the task class declares no toolsets of
    its own (a per-rollout server subprocess would be started otherwise);
  * the interception (verifiers' model proxy that records the trace): ONE ``InterceptionServer``, injected as
    ``vf.Agent(config, interception=server)``; it keeps one upstream client per distinct client config, so every
    agent names the policy endpoint's ROOT URL (``.../v1``) and the harness names its episode with the endpoint's
    ``X-Episode-Id`` header (verifiers relays the harness's headers upstream). A base URL not of the form
    ``<root>/episodes/<id>/v1`` falls back to verifiers' default: an interception server per run;
  * in the harness: one HTTP connection pool, and one MCP client per tool-server URL (a shared server without
    per-rollout state has one URL for every rollout); building these per episode made TLS contexts
    (``load_verify_locations``) the largest CPU cost.

Per episode: a ``vf.Agent`` (a cheap value), ``agent.run``'s subprocess "runtime" (a temporary folder), a slot on
the interception, the chat loop (``SharedEndpointHarness``, in-process), and scoring by the task's ``@vf.reward``
(``MultiplyTask.correct`` of ``verifiers_calculator_env``) on the recorded trace.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
# the shared tool server runs as ``python -m verifiers_calculator_env`` (verifiers starts it by module name)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)

import httpx  # noqa: E402
import verifiers.v1 as vf  # noqa: E402
import verifiers_calculator_env as single  # noqa: E402  (the tool, the task data and reward)
from verifiers.v1.interception import InterceptionServer  # noqa: E402
from verifiers.v1.mcp import serve_shared  # noqa: E402

MODULE = "verifiers_shared_calculator_env"  # the harness id verifiers imports this file by
MAX_CONCURRENT = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
EPISODE_URL = re.compile(r"^(?P<root>.+)/episodes/(?P<episode>[^/]+)/v1/?$")


class EpisodeData(single.MultiplyData):
    episode_id: str = ""  # sent as X-Episode-Id when the agent's client names the endpoint's root URL


class SharedMultiplyTask(single.MultiplyTask):
    """The same task and ``@vf.reward``; its calculator is the process-wide shared server, not one per rollout."""

    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return []


# ----- process-wide clients of the harness ---------------------------------------------------------------------------
_http: httpx.AsyncClient | None = None
_mcp: dict[str, tuple] = {}  # tool-server URLs -> (tools, dispatch, connections)
_mcp_lock: asyncio.Lock | None = None
_mcp_stack = AsyncExitStack()


def http_client() -> httpx.AsyncClient:
    global _http
    if _http is None:
        _http = httpx.AsyncClient(
            timeout=httpx.Timeout(600, connect=60),  # a busy event loop must not fail a localhost connect
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
    return _http


async def mcp_tools(mcp_urls: dict[str, str]) -> tuple:
    """One MCP client per set of server URLs for the whole process (its calls are serialized by verifiers'
    ``MCPConnection``); a URL tagged with per-rollout state differs per rollout, so it is never shared."""
    global _mcp_lock
    from verifiers.v1.harnesses.utils.mcp import connect_mcp

    key = json.dumps(mcp_urls, sort_keys=True)
    _mcp_lock = _mcp_lock or asyncio.Lock()
    async with _mcp_lock:
        if key not in _mcp:
            servers = {"mcpServers": {name: {"url": url} for name, url in mcp_urls.items()}}
            _mcp[key] = await connect_mcp(servers, _mcp_stack)
    return _mcp[key]


async def close_clients() -> None:
    await _mcp_stack.aclose()
    if _http is not None:
        await _http.aclose()


class SharedEndpointHarness(single.EndpointHarness):
    """``EndpointHarness``'s chat loop (at most two model turns through verifiers' interception), on the
    process-wide HTTP pool and MCP client."""

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        from openai import AsyncOpenAI
        from verifiers.v1.dialects.chat import message_to_wire

        _, prompt = self.resolve_prompt(data)
        messages = [message_to_wire(m) for m in prompt]
        headers = {"X-Episode-Id": data.episode_id} if getattr(data, "episode_id", "") else None
        client = AsyncOpenAI(
            base_url=endpoint, api_key=secret, max_retries=0, http_client=http_client(), default_headers=headers
        )
        tools, dispatch, connections = await mcp_tools(mcp_urls) if mcp_urls else ([], {}, {})
        await single.chat_loop(client, ctx.model, messages, tools, dispatch, connections)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")  # the client is not closed: its pool is shared


__all__ = ["SharedEndpointHarness"]  # verifiers finds the harness by module __all__


# ----- the process ---------------------------------------------------------------------------------------------------
def key_variable(api_key: str) -> str:
    """verifiers reads the upstream key from an environment variable: one variable per distinct key."""
    name = "VF_EPISODE_KEY_" + hashlib.sha1(api_key.encode()).hexdigest()[:12]
    os.environ[name] = api_key or "EMPTY"
    return name


async def episode(task: dict, shared: dict, interception: InterceptionServer, poster: httpx.AsyncClient) -> None:
    started = time.monotonic()
    name = task.get("episode_id", "?")
    try:
        match = EPISODE_URL.match(task["base_url"])
        config = vf.AgentConfig(
            harness=vf.HarnessConfig(id=MODULE),
            runtime=vf.SubprocessConfig(),
            model=task["model"],
            client=vf.EvalClientConfig(
                base_url=match["root"] + "/v1" if match else task["base_url"],
                api_key_var=key_variable(task.get("api_key", "")),
            ),
            max_turns=single.MAX_TURNS,
        )
        agent = vf.Agent(config, interception=interception if match else None)
        data = EpisodeData(prompt=task["messages"], answer=task["label"], episode_id=match["episode"] if match else "")
        trace = await agent.run(SharedMultiplyTask(data), tools=shared)
        errors = "; ".join(f"{e.type}: {e.message}" for e in trace.errors)
        if not trace.num_turns:  # nothing reached the policy: ended without a reward (dropped)
            print(name, "no model turn:", errors, flush=True)
            await end_without_reward(poster, task)
            return
        reward = float(trace.reward)
        answer = await poster.post(
            task["base_url"].rstrip("/") + "/reward",
            json={"reward": reward},
            headers={"Authorization": f"Bearer {task.get('api_key', '')}"},
        )
        answer.raise_for_status()
        print(name, reward, f"{time.monotonic() - started:.2f}s", trace.stop_condition, errors, flush=True)
    except Exception as exc:  # one episode's failure never ends the process
        print(name, "failed:", f"{type(exc).__name__}: {exc}", flush=True)
        await end_without_reward(poster, task)


async def end_without_reward(poster: httpx.AsyncClient, task: dict) -> None:
    """Tell the trainer the episode is over (POST .../end): with require_reward it is dropped now, not at its
    timeout."""
    try:
        headers = {"Authorization": f"Bearer {task.get('api_key', '')}"}
        await poster.post(task["base_url"].rstrip("/") + "/end", headers=headers)
    except (httpx.HTTPError, KeyError):
        pass  # the episode ends at the trainer's timeout instead


async def serve() -> None:
    started = time.monotonic()
    gate = asyncio.Semaphore(MAX_CONCURRENT)
    running: set[asyncio.Task] = set()
    async with (
        serve_shared([single.CalculatorTools(vf.ToolsetConfig())]) as shared,
        InterceptionServer() as interception,
    ):
        poster = http_client()
        print(f"# ready after {time.monotonic() - started:.2f}s (max {MAX_CONCURRENT} episodes at once)", flush=True)

        async def guarded(task: dict) -> None:
            try:
                await episode(task, shared, interception, poster)
            finally:
                gate.release()

        try:
            while True:
                line = await asyncio.to_thread(sys.stdin.readline)
                if not line:
                    break
                try:
                    task = json.loads(line)
                except ValueError:
                    if line.strip():
                        print("# not a JSON task:", line.strip()[:200], flush=True)
                    continue
                await gate.acquire()  # back-pressure: at most MAX_CONCURRENT episodes at once
                job = asyncio.create_task(guarded(task))
                running.add(job)
                job.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running)
        finally:
            await close_clients()


def main() -> int:
    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    # run as the module verifiers imports (harness id MODULE), so that its harness class is found by that name
    import verifiers_shared_calculator_env

    sys.exit(verifiers_shared_calculator_env.main())
