"""The multiply task as a verifiers (0.4.0, ``verifiers.v1``) environment, run as a command harness.

verifiers pins ``openai<3``, so it lives in a venv of its own, not the trainer's:

    python3.11 -m venv .venv-agents && .venv-agents/bin/pip install verifiers==0.4.0
    rl_config.policy_endpoint.command: "/path/.venv-agents/bin/python examples/agents/verifiers_calculator_env.py"

Per episode (the task as JSON on standard input, OPENAI_BASE_URL / OPENAI_API_KEY from the environment):

  * ``MultiplyTask`` is a ``vf.Task``: the task's messages (system + user, unchanged) as its prompt, the label as its
    answer, a ``@vf.reward`` that checks the number after ``####`` in the last reply (verifiers 0.4.0 has no Rubric
    class: a task's rewards are its ``@vf.reward`` methods, summed into ``trace.reward``);
  * ``CalculatorTools`` is a ``vf.Toolset``: the ``calculator(expression)`` tool, served over MCP by verifiers in a
    subprocess (``python -m verifiers_calculator_env``, hence this file's directory on PYTHONPATH);
  * ``EndpointHarness`` is a ``vf.Harness`` whose chat loop runs in-process (verifiers' built-in ``null``/``bash``
    harnesses install their loop with ``uv`` from the network): at most two model turns through verifiers'
    interception server, which relays each request to the policy endpoint and records the trace;
  * ``vf.Agent(...).run(task)`` runs the rollout and scores it; the reward is posted to ``{OPENAI_BASE_URL}/reward``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import verifiers.v1 as vf
from calculator_agent import calculate, number_after_marks  # the openai-client agent beside this file: one calculator

MODULE = "verifiers_calculator_env"  # the name verifiers imports this file by (harness id, tool server)
HERE = str(Path(__file__).resolve().parent)
MAX_TURNS = 2


# ----- the environment: tool, task (with its reward), harness ------------------------------------------------------
class CalculatorTools(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # advertise the tool bare: "calculator", not "calculator_tools_calculator"

    @vf.tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * / on numbers)."""
        return calculate(expression)


class MultiplyData(vf.TaskData):
    answer: str = ""  # the dataset's label, e.g. "#### 3367"


class MultiplyTask(vf.Task[MultiplyData]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [CalculatorTools(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        """1.0 when the last reply's number after '####' is the label's."""
        expected = number_after_marks(self.data.answer) or self.data.answer.strip()
        return 1.0 if number_after_marks(trace.last_reply) == expected else 0.0


async def chat_loop(client, model: str, messages: list, tools: list, dispatch: dict, connections: dict) -> None:
    """At most MAX_TURNS model turns: each answer's tool calls run on the MCP servers, their results sent back."""
    from verifiers.v1.harnesses.utils.mcp import call_mcp

    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(
            model=model, messages=messages, **({"tools": tools} if tools else {})
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            try:
                arguments = json.loads(call.function.arguments or "{}")
                result = await call_mcp(connections, dispatch, call.function.name, arguments)
            except (ValueError, KeyError, TypeError) as exc:  # bad JSON or an unknown tool: the model's error
                result = f"Error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if not message.tool_calls:
            break


class EndpointHarness(vf.Harness[vf.HarnessConfig]):
    """A chat loop in this process: verifiers allows it as long as every model call goes to ``endpoint``."""

    APPENDS_SYSTEM_PROMPT = True  # the prompt's own system message is kept as it is
    SUPPORTS_MCP = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        from openai import AsyncOpenAI
        from verifiers.v1.dialects.chat import message_to_wire
        from verifiers.v1.harnesses.utils.mcp import connect_mcp

        _, prompt = self.resolve_prompt(data)
        messages = [message_to_wire(m) for m in prompt]
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        async with AsyncExitStack() as stack:
            servers = {"mcpServers": {name: {"url": url} for name, url in mcp_urls.items()}}
            await chat_loop(client, ctx.model, messages, *await connect_mcp(servers, stack))
        await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["EndpointHarness", "CalculatorTools", "MultiplyTask"]  # verifiers finds the harness by module __all__


# ----- the command --------------------------------------------------------------------------------------------------
async def rollout(task: dict) -> vf.Trace:
    agent = vf.Agent(
        vf.AgentConfig(
            harness=vf.HarnessConfig(id=MODULE),
            runtime=vf.SubprocessConfig(),  # tool server and harness on this host
            model=task["model"],
            client=vf.EvalClientConfig(base_url=os.environ["OPENAI_BASE_URL"], api_key_var="OPENAI_API_KEY"),
            max_turns=MAX_TURNS,  # verifiers refuses a third model turn
        )
    )
    data = MultiplyData(prompt=task["messages"], answer=task["label"])
    return await agent.run(MultiplyTask(data))


def main() -> int:
    started = time.monotonic()
    task = json.load(sys.stdin)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    trace = asyncio.run(rollout(task))
    errors = "; ".join(f"{e.type}: {e.message}" for e in trace.errors)
    if not trace.num_turns:  # nothing reached the policy (a tool server that did not start, ...): drop the episode
        print(task["episode_id"], "no model turn:", errors, flush=True)
        return 1
    reward = float(trace.reward)  # scored even when the rollout ended early (its errors are printed)
    import httpx

    httpx.post(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/reward",
        json={"reward": reward},
        headers={"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}"},
        timeout=60,
    ).raise_for_status()
    print(task["episode_id"], reward, f"{time.monotonic() - started:.1f}s", trace.stop_condition, errors, flush=True)
    return 0


if __name__ == "__main__":
    if os.environ.get("VF_CONFIG"):  # started by verifiers as the tool server
        CalculatorTools.run()
    else:  # the harness: run as the module verifiers imports, so that its classes are found by that name
        sys.path.insert(0, HERE)
        import verifiers_calculator_env

        sys.exit(verifiers_calculator_env.main())
