"""Rollout functions: how a batch of prompts becomes trajectories (``rl_config.rollout_function``).

    single_turn        one response per sample (the default)
    tool_agent         multi-turn: generate, parse tool calls, run them, append their results, continue
    module:function    a user's own, called like the built-ins: ``fn(request, context) -> AgentBatch``

A trajectory is kept as token ids exactly as the engine generated them (token in, token out): the next turn's
input is the prompt plus every token so far, never a re-tokenised conversation. Tool results are appended as
tokens with ``loss_mask`` 0 (attended to, never trained on) and rollout log-prob 0. The loop runs on the
driver, once per trajectory whatever the engines' tensor-parallel size, so each tool call runs exactly once.

The tool agent, per turn over every unfinished trajectory:
1. generate until the end of the assistant turn (EOS), within what is left of the response budget;
2. parse the turn's tool calls (``tool_parser_format``); a turn without one is the answer: done;
3. run the calls in the sandbox (at most ``max_parallel_calls`` per turn; malformed, unknown, failing,
   hanging and oversized calls answer with an error message and are counted);
4. append the results in the chat template's tool turn (``tool_response_*`` of configs/model/templates.json),
   truncated to ``max_tool_response_length`` characters; the trajectory ends when the budget is spent,
   after ``max_turns`` assistant turns, or when a turn would exceed ``max_tool_calls`` in total.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..protocol.rollout import RolloutOutput, RolloutRequest
from ..tools.parser import PARSERS, ToolCall
from ..tools.registry import ToolSpec, import_function
from ..tools.sandbox import Sandbox, ToolResult

TURN_SEED_STRIDE = 10_007  # turn t of a request seeded s samples with seeds s + t * stride + i


@dataclass
class AgentBatch:
    """A rollout function's answer: one output per (prompt, sample), and metrics of the batch."""

    outputs: List[RolloutOutput]
    metrics: Dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolFormat:
    """How tool results enter the conversation (a chat template's tool role)."""

    turn_prefix: str  # after the assistant's end-of-turn token, before the first result
    response: str  # one result, with {content}
    turn_suffix: str  # after the last result: opens the next assistant turn

    @staticmethod
    def of_template(template: Dict[str, str], name: str) -> "ToolFormat":
        keys = ("tool_turn_prefix", "tool_response", "tool_turn_suffix")
        missing = [k for k in keys if k not in template]
        if missing:
            raise ValueError(
                f"prompt_type {name!r} has no tool role in configs/model/templates.json (missing {', '.join(missing)})"
            )
        return ToolFormat(*(template[k] for k in keys))

    def render(self, contents: Sequence[str]) -> str:
        return self.turn_prefix + "".join(self.response.format(content=c) for c in contents) + self.turn_suffix


@dataclass(frozen=True)
class AgentSettings:
    max_turns: int = 4
    max_tool_calls: int = 4
    max_parallel_calls: int = 1
    max_tool_response_length: int = 512
    tool_response_truncate_side: str = "middle"
    tool_parser_format: str = "hermes"
    tool_workers: int = 2


@dataclass
class AgentContext:
    """What a rollout function may use: ``generate`` (the rollout service, blocking), the tokenizer, the
    tools with their sandbox, the loop's settings, and the tools each prompt may call (None: all)."""

    generate: Callable[[RolloutRequest], List[RolloutOutput]]
    tokenizer: Any
    tools: Dict[str, ToolSpec] = field(default_factory=dict)
    sandbox: Optional[Sandbox] = None
    settings: AgentSettings = AgentSettings()
    tool_format: Optional[ToolFormat] = None
    prompt_tools: Optional[List[Optional[List[str]]]] = None


RolloutFunction = Callable[[RolloutRequest, AgentContext], AgentBatch]


def single_turn(request: RolloutRequest, context: AgentContext) -> AgentBatch:
    """One response per sample: prompt in, generated tokens out."""
    return AgentBatch(context.generate(request))


@dataclass
class Trajectory:
    prompt_index: int
    prompt: List[int]
    budget: int
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    loss_mask: List[int] = field(default_factory=list)
    finish_reason: str = "stop"
    done: bool = False
    turns: int = 0
    calls: int = 0
    observation_tokens: int = 0

    def append(self, tokens: Sequence[int], logprobs: Sequence[float], trained: bool) -> None:
        self.tokens += list(tokens)
        self.logprobs += list(logprobs) if trained else [0.0] * len(tokens)
        self.loss_mask += [1 if trained else 0] * len(tokens)

    @property
    def left(self) -> int:
        return self.budget - len(self.tokens)

    def output(self) -> RolloutOutput:
        return RolloutOutput(
            self.prompt_index, self.tokens, self.logprobs, self.finish_reason, loss_mask=self.loss_mask
        )


def truncate(text: str, limit: int, side: str) -> str:
    """``text`` cut to ``limit`` characters on ``side`` (left keeps the end, right the start, middle both)."""
    if limit <= 0 or len(text) <= limit:
        return text
    marker = "...(truncated)..."
    if side == "left":
        return marker + text[-limit:]
    if side == "right":
        return text[:limit] + marker
    head = limit // 2
    return text[:head] + marker + text[len(text) - (limit - head) :]


def tool_agent(request: RolloutRequest, context: AgentContext) -> AgentBatch:
    """The multi-turn tool loop (module docstring)."""
    s, tok = context.settings, context.tokenizer
    if context.tool_format is None or context.sandbox is None:
        raise ValueError("the tool_agent rollout function needs tools, a sandbox and a chat template with a tool role")
    parse = PARSERS[s.tool_parser_format]
    budgets = request.max_new_tokens
    if not budgets and request.sampling is None:
        raise ValueError("tool_agent: the request names no response budget (sampling.max_tokens)")
    trajectories = [
        Trajectory(i, list(p), int(budgets[i]) if budgets else request.sampling.max_tokens)
        for i, p in enumerate(request.prompts)
        for _ in range(request.n)
    ]
    tool_seconds = 0.0
    counts = {"error": 0, "timeout": 0, "oversized": 0, "crash": 0, "malformed": 0}
    turn = 0
    while True:
        active = [t for t in trajectories if not t.done]
        if not active:
            break
        if turn == 0:
            outputs = context.generate(request)
            order = _by_prompt(outputs, len(request.prompts), request.n)
        else:
            order = context.generate(
                RolloutRequest(
                    [t.prompt + t.tokens for t in active],
                    1,
                    request.seed + TURN_SEED_STRIDE * turn,
                    request.sampling,
                    [t.left for t in active],
                )
            )
            order = sorted(order, key=lambda o: o.prompt_index)
        pending: List[tuple] = []  # (trajectory, [(call, spec) or error message])
        for traj, out in zip(active, order):
            traj.append(out.response_ids, out.logprobs, trained=True)
            traj.turns += 1
            if out.finish_reason == "length" or traj.left <= 0:
                traj.finish_reason, traj.done = "length", True
                continue
            parsed = parse(tok.decode(out.response_ids, skip_special_tokens=False))
            if not parsed.wants_tools:
                traj.done = True
                continue
            if traj.turns >= s.max_turns or traj.calls >= s.max_tool_calls:
                traj.done = True  # asked for a tool with no turn or call left: the trajectory ends here
                continue
            items: List[Any] = list(parsed.errors)
            counts["malformed"] += len(parsed.errors)
            room = min(s.max_parallel_calls, s.max_tool_calls - traj.calls)
            for k, call in enumerate(parsed.calls):
                if k >= room:
                    items.append(f"Error: at most {room} tool call(s) allowed here; {call.name} was not run")
                    counts["error"] += 1
                    continue
                item = _checked(call, context, traj.prompt_index)
                counts["error"] += isinstance(item, str)
                items.append(item)
            traj.calls += sum(1 for item in items if not isinstance(item, str))
            pending.append((traj, items))
        # every tool call of this turn, over all trajectories, runs once in the sandbox
        calls = [
            (item[1].function, item[0].arguments) for _, items in pending for item in items if not isinstance(item, str)
        ]
        t0 = time.perf_counter()
        results = iter(context.sandbox.run_many(calls, s.tool_workers))
        tool_seconds += time.perf_counter() - t0
        for traj, items in pending:
            contents = []
            for item in items:
                if isinstance(item, str):
                    contents.append(item)
                    continue
                result: ToolResult = next(results)
                if not result.ok:
                    counts[result.status] += 1
                contents.append(truncate(result.content, s.max_tool_response_length, s.tool_response_truncate_side))
            observation = tok.encode(context.tool_format.render(contents), add_special_tokens=False)
            if len(observation) >= traj.left:  # no room to answer after it
                observation = observation[: traj.left]
                traj.finish_reason, traj.done = "length", True
            traj.append(observation, [], trained=False)
            traj.observation_tokens += len(observation)
        turn += 1
    return AgentBatch([t.output() for t in trajectories], _metrics(trajectories, counts, tool_seconds))


def _by_prompt(outputs: Sequence[RolloutOutput], prompts: int, n: int) -> List[RolloutOutput]:
    """The first turn's outputs in trajectory order (prompt by prompt, samples in the engine's order)."""
    grouped: List[List[RolloutOutput]] = [[] for _ in range(prompts)]
    for out in outputs:
        grouped[out.prompt_index].append(out)
    if any(len(g) != n for g in grouped):
        raise RuntimeError(f"tool_agent: expected {n} responses per prompt from the engines")
    return [o for g in grouped for o in g]


def _checked(call: ToolCall, context: AgentContext, prompt_index: int):
    """(call, spec) for a call the sandbox should run, or the error message that answers it."""
    allowed = context.prompt_tools[prompt_index] if context.prompt_tools else None
    spec = context.tools.get(call.name)
    if spec is None or (allowed is not None and call.name not in allowed):
        names = sorted(allowed if allowed is not None else context.tools)
        return f"Error: unknown tool {call.name!r}; available: {', '.join(names)}"
    missing = spec.missing_arguments(call.arguments)
    if missing:
        return f"Error: {call.name} needs argument(s) {', '.join(missing)}"
    return call, spec


def _metrics(trajectories: List[Trajectory], counts: Dict[str, int], tool_seconds: float) -> Dict[str, float]:
    n = max(1, len(trajectories))
    generated = [sum(t.loss_mask) for t in trajectories]
    return {
        "multi_turn/num_turns/mean": sum(t.turns for t in trajectories) / n,
        "multi_turn/num_turns/max": float(max((t.turns for t in trajectories), default=0)),
        "multi_turn/generated_tokens/mean": sum(generated) / n,
        "multi_turn/observation_tokens/mean": sum(t.observation_tokens for t in trajectories) / n,
        "tool_calls/mean": sum(t.calls for t in trajectories) / n,
        "tool_calls/rate": sum(1 for t in trajectories if t.calls) / n,
        "tool_calls/errors": float(counts["error"] + counts["crash"] + counts["oversized"] + counts["malformed"]),
        "tool_calls/malformed": float(counts["malformed"]),
        "tool_calls/oversized": float(counts["oversized"]),
        "tool_calls/timeouts": float(counts["timeout"]),
        "timing/tool": tool_seconds,
    }


ROLLOUT_FUNCTIONS: Dict[str, RolloutFunction] = {"single_turn": single_turn, "tool_agent": tool_agent}


def rollout_function(name: str) -> RolloutFunction:
    """A built-in by name, or a user's function by its path ``module:function``."""
    if name in ROLLOUT_FUNCTIONS:
        return ROLLOUT_FUNCTIONS[name]
    if ":" not in name and "." not in name:
        raise ValueError(
            f"unknown rollout_function {name!r}; built in: {', '.join(ROLLOUT_FUNCTIONS)}, "
            "or a function as 'module:function'"
        )
    return import_function(name, "rollout_function")
