"""An agent outside the trainer for the multiply task (configs/grpo_tiny_cpu_openai_agent.yaml).

It is written for any OpenAI-compatible server: it asks the policy for a turn with the calculator offered as a
tool, runs the calls the answer makes itself, sends their results back as tool messages, and scores the final
answer against the task's label. The trainer sees only the conversation's tokens and the returned reward.

    entry point:  rl_config.policy_endpoint.entry_point: examples.agents.calculator_agent:run_episode
    command:      rl_config.policy_endpoint.command: "{python} examples/agents/calculator_agent.py"
                  (the task as JSON on standard input; OPENAI_BASE_URL / OPENAI_API_KEY from the environment;
                  the reward posted to the endpoint)
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """+ - * / on numbers, nothing else."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only + - * / on numbers")

    try:
        result = value(ast.parse(str(expression), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def number_after_marks(text: str):
    found = re.findall(r"####\s*(-?\d+)", text or "")
    return found[-1] if found else None


def play(client, model: str, messages: list, max_turns: int = 2) -> str:
    """The conversation until an answer without tool calls, or ``max_turns``; returns the last answer's text."""
    answer = ""
    for _ in range(max_turns):
        try:
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        except openai.APIStatusError:  # the trainer ended the episode (its token budget): score what there is
            break
        message = reply.choices[0].message
        answer = message.content or ""
        calls = message.tool_calls or []
        messages.append(
            {"role": "assistant", "content": message.content, "tool_calls": [c.model_dump() for c in calls]}
        )
        if not calls:
            break
        for call in calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    return answer


def run_episode(task) -> float:
    """The entry-point form: ``task`` is the trainer's EpisodeTask; the returned number is the reward."""
    answer = play(task.client(max_retries=0), task.model, list(task.messages))
    expected = number_after_marks(task.label) or task.label.strip()
    return 1.0 if number_after_marks(answer) == expected else 0.0


def main() -> int:
    """The command form: the task on standard input, the reward posted to the endpoint."""
    task = json.load(sys.stdin)
    client = openai.OpenAI(max_retries=0)
    answer = play(client, task["model"], list(task["messages"]))
    expected = number_after_marks(task["label"]) or task["label"].strip()
    reward = 1.0 if number_after_marks(answer) == expected else 0.0
    client.post("/reward", body={"reward": reward}, cast_to=object)
    print(os.environ.get("MINDSPEED_RL_EPISODE_ID"), repr(answer), reward, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
