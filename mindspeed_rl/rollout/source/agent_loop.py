"""Rollout functions: how one trajectory advances (``rl_config.rollout_function``).

    single_turn        one response per sample (the default)
    tool_agent         multi-turn: generate a turn, parse its tool calls, run them, append their results, continue
    openai_agent       an outside agent's episodes through the run's OpenAI-compatible endpoint (external_agent.py)
    module:Class       a user's own: a subclass of ``RolloutFunction``, built with the ``AgentContext``
    module:function    a user's whole-batch function ``fn(request, context) -> AgentBatch`` (synchronous
                       schedules only: it cannot be stopped between chunks)

A rollout function never calls the engine itself: the schedule (``rollout/source/rounds.py``) gives every ready
trajectory one generation of at most a chunk of tokens per round and hands the result to ``absorb``. What
``absorb`` returns is the trajectory's tool work; the pool runs it in a thread while the next round
generates, then hands the results to ``observe``. So a trajectory whose turn ended runs its tools and is
submitted for its next turn without waiting for the turns of the others, and the same function runs under
every schedule (whole turns, partial chunks, batches ahead) and under every group filter.

A trajectory is kept as token ids exactly as the engine generated them (token in, token out): the next
turn's input is the prompt plus every token so far, never a re-tokenised conversation. Tool results are
appended with ``loss_mask`` 0 (attended to, never trained on) and rollout log-prob 0.

The tool agent, for one trajectory:
1. generate until the end of the assistant turn (EOS), within what is left of the response budget (a turn
   may take several chunks);
2. parse the turn's tool calls (``rl_config.agent.tool_parser_format``); a turn without one is the answer: finished;
3. run the calls in the sandbox (at most ``max_parallel_calls`` per turn; malformed, unknown, failing,
   hanging and oversized calls answer with an error message and are counted);
4. append the results in the chat template's tool turn (``tool_response_*`` of configs/model/templates.json),
   truncated to ``max_tool_response_length`` characters; the trajectory is cut when the budget is spent,
   and finished after ``max_turns`` assistant turns or when a turn would exceed ``max_tool_calls`` in total.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from ...config_cls.agent_config import AgentConfig
from ...datasets.templates import ToolFormat
from ...protocol.rollout import RolloutOutput, RolloutRequest
from ...tools.parser import PARSERS, ToolCall
from ...tools.registry import ToolSpec, import_function
from ...tools.sandbox import Sandbox, ToolResult
from .trajectory import CUT, FINISHED, Trajectory

ERROR_KINDS = ("error", "timeout", "oversized", "crash", "malformed")


@dataclass
class AgentBatch:
    """A whole-batch rollout function's answer: one output per (prompt, sample), and metrics of the batch."""

    outputs: List[RolloutOutput]
    metrics: Dict[str, float] = field(default_factory=dict)


@dataclass
class AgentContext:
    """What a rollout function may use: the tokenizer, the tools with their sandbox, the loop's settings and
    the template's tool role; whole-batch functions also get ``generate`` (the rollout service, blocking) and
    the tools each prompt may call (None: all)."""

    generate: Optional[Callable[[RolloutRequest], List[RolloutOutput]]]
    tokenizer: Any
    tools: Dict[str, ToolSpec] = field(default_factory=dict)
    sandbox: Optional[Sandbox] = None
    settings: AgentConfig = field(default_factory=AgentConfig)
    tool_format: Optional[ToolFormat] = None
    prompt_tools: Optional[List[Optional[List[str]]]] = None
    endpoint: Any = None  # openai_agent: the policy endpoint's keys and limits (external_agent.EndpointRun)


class RolloutFunction:
    """How one trajectory advances. Subclass it and name it in ``rl_config.rollout_function``
    (``pkg.module:Class``); it is built once per run with the ``AgentContext``."""

    name = "rollout_function"
    whole_batch = False  # True: ``run_batch`` produces whole trajectories at once (no chunks, no rounds)
    rewards_episodes = False  # True: trajectories may carry a reward of their own (Trajectory.reward)

    def __init__(self, context: AgentContext) -> None:
        self.context = context

    def open(self, traj: Trajectory) -> Optional[Any]:
        """A new (or restored) trajectory's work before its first generation, run like tool work; None: none."""
        return None

    def absorb(self, traj: Trajectory, out: RolloutOutput, version: int) -> Optional[Any]:
        """Append what the engine generated for ``traj`` (one chunk or the rest of a turn, sampled by policy
        ``version``) and set its status. Returns the tool work its ended turn asks for, or None."""
        raise NotImplementedError

    def run_tools(self, works: List[Any]) -> List[Any]:
        """Run the tool work of several trajectories (in the pool's tool thread); one result per work."""
        return [None] * len(works)

    def run_batch(self, request: RolloutRequest, generate: Callable, prompt_tools: List) -> "AgentBatch":
        """A whole-batch function (``whole_batch``): the request's trajectories produced at once."""
        raise NotImplementedError(f"{self.name} advances trajectories one chunk at a time (whole_batch is False)")

    def observe(self, traj: Trajectory, work: Any, result: Any, version: int) -> None:
        """Append the results of ``traj``'s tool work; the trajectory is ready for its next turn."""

    def metrics(self, trajectories: Sequence[Trajectory]) -> Dict[str, float]:
        """Metrics of the trajectories a batch trains on."""
        return {}

    def close(self) -> None:
        """Release what the function holds (the tools' processes are per call: nothing by default)."""


class SingleTurn(RolloutFunction):
    """One response per sample: prompt in, generated tokens out (in chunks under partial rollout)."""

    name = "single_turn"

    def absorb(self, traj: Trajectory, out: RolloutOutput, version: int) -> None:
        traj.append(out.response_ids, out.logprobs, out.versions or version, trained=True, routes=out.routed_experts)
        if out.finish_reason == "stop" and out.response_ids:
            traj.end(FINISHED, "stop")
        elif traj.remaining() <= 0 or not out.response_ids:
            traj.end(CUT, "length")


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


class ToolAgent(RolloutFunction):
    """The multi-turn tool loop of the module docstring. Its tool work is a list per turn: ``(call, spec)``
    for a call the sandbox runs, or the error message that answers a call that is not run."""

    name = "tool_agent"

    def __init__(self, context: AgentContext) -> None:
        super().__init__(context)
        if context.tool_format is None or context.sandbox is None:
            raise ValueError(
                "the tool_agent rollout function needs tools, a sandbox and a chat template with a tool role"
            )
        self.settings, self.parse = context.settings, PARSERS[context.settings.tool_parser_format]
        self.sandbox, self.tool_format = context.sandbox, context.tool_format

    def absorb(self, traj: Trajectory, out: RolloutOutput, version: int) -> Optional[List[Any]]:
        s = self.settings
        traj.append(out.response_ids, out.logprobs, out.versions or version, trained=True, routes=out.routed_experts)
        if out.finish_reason != "stop" or not out.response_ids:
            if traj.remaining() <= 0 or not out.response_ids:
                traj.turns += 1
                traj.end(CUT, "length")
            return None  # the chunk ended inside the turn: it continues next round
        traj.turns += 1
        if traj.remaining() <= 0:
            traj.end(CUT, "length")
            return None
        turn = self.context.tokenizer.decode(traj.tokens[traj.turn_start :], skip_special_tokens=False)
        parsed = self.parse(turn)
        if not parsed.wants_tools or traj.turns >= s.max_turns or traj.calls >= s.max_tool_calls:
            traj.end(FINISHED, "stop")  # the answer, or a tool asked for with no turn or call left
            return None
        items: List[Any] = list(parsed.errors)
        traj.count_error("malformed", len(parsed.errors))
        room = min(s.max_parallel_calls, s.max_tool_calls - traj.calls)
        for k, call in enumerate(parsed.calls):
            if k >= room:
                items.append(f"Error: at most {room} tool call(s) allowed here; {call.name} was not run")
                traj.count_error("error")
                continue
            item = self._checked(call, traj.tools)
            traj.count_error("error", int(isinstance(item, str)))
            items.append(item)
        traj.calls += sum(1 for item in items if not isinstance(item, str))
        return items

    def _checked(self, call: ToolCall, allowed: Optional[List[str]]):
        """(call, spec) for a call the sandbox should run, or the error message that answers it."""
        tools = self.context.tools
        spec = tools.get(call.name)
        if spec is None or (allowed is not None and call.name not in allowed):
            names = sorted(allowed if allowed is not None else tools)
            return f"Error: unknown tool {call.name!r}; available: {', '.join(names)}"
        missing = spec.missing_arguments(call.arguments)
        if missing:
            return f"Error: {call.name} needs argument(s) {', '.join(missing)}"
        return call, spec

    def run_tools(self, works: List[List[Any]]) -> List[List[Optional[ToolResult]]]:
        """Every call of the given turns, once each in the sandbox (``tool_workers`` at a time)."""
        calls = [
            (item[1].function, item[0].arguments) for items in works for item in items if not isinstance(item, str)
        ]
        results = iter(self.sandbox.run_many(calls, self.settings.tool_workers))
        return [[None if isinstance(item, str) else next(results) for item in items] for items in works]

    def observe(self, traj: Trajectory, work: List[Any], result: List[Optional[ToolResult]], version: int) -> None:
        s, contents = self.settings, []
        for item, answer in zip(work, result):
            if answer is None:
                contents.append(item)
                continue
            if not answer.ok:
                traj.count_error(answer.status)
            contents.append(truncate(answer.content, s.max_tool_response_length, s.tool_response_truncate_side))
        text = self.tool_format.render(contents)
        observation = self.context.tokenizer.encode(text, add_special_tokens=False)
        cut = len(observation) >= traj.remaining()  # no room to answer after it
        observation = observation[: traj.remaining()]
        traj.append(observation, [], version, trained=False)
        traj.observation_tokens += len(observation)
        traj.turn_start = len(traj.tokens)
        if cut:
            traj.end(CUT, "length")

    def metrics(self, trajectories: Sequence[Trajectory]) -> Dict[str, float]:
        n = max(1, len(trajectories))
        errors = {k: sum(t.tool_errors.get(k, 0) for t in trajectories) for k in ERROR_KINDS}
        return {
            "multi_turn/num_turns/mean": sum(t.turns for t in trajectories) / n,
            "multi_turn/num_turns/max": float(max((t.turns for t in trajectories), default=0)),
            "multi_turn/generated_tokens/mean": sum(sum(t.loss_mask) for t in trajectories) / n,
            "multi_turn/observation_tokens/mean": sum(t.observation_tokens for t in trajectories) / n,
            "tool_calls/mean": sum(t.calls for t in trajectories) / n,
            "tool_calls/rate": sum(1 for t in trajectories if t.calls) / n,
            "tool_calls/errors": float(errors["error"] + errors["crash"] + errors["oversized"] + errors["malformed"]),
            "tool_calls/malformed": float(errors["malformed"]),
            "tool_calls/oversized": float(errors["oversized"]),
            "tool_calls/timeouts": float(errors["timeout"]),
        }


class WholeBatch(RolloutFunction):
    """A user's function ``fn(request, context) -> AgentBatch``: it gets all of a round's new trajectories as
    one request (n per prompt) and returns them whole."""

    whole_batch = True

    def __init__(self, context: AgentContext, fn: Callable) -> None:
        super().__init__(context)
        self.fn, self.name = fn, getattr(fn, "__name__", "rollout_function")
        self.last_metrics: Dict[str, float] = {}

    def run_batch(self, request: RolloutRequest, generate, prompt_tools) -> AgentBatch:
        context = AgentContext(
            generate,
            self.context.tokenizer,
            self.context.tools,
            self.context.sandbox,
            self.context.settings,
            self.context.tool_format,
            prompt_tools,
        )
        batch = self.fn(request, context)
        batch = batch if isinstance(batch, AgentBatch) else AgentBatch(list(batch))
        self.last_metrics = {k: v for k, v in batch.metrics.items() if not k.startswith("timing/")}
        return batch

    def metrics(self, trajectories: Sequence[Trajectory]) -> Dict[str, float]:
        return dict(self.last_metrics)


ROLLOUT_FUNCTIONS: Dict[str, Any] = {
    "single_turn": SingleTurn,
    "tool_agent": ToolAgent,
    "openai_agent": "mindspeed_rl.rollout.source.external_agent:OpenAIAgent",  # loads the HTTP stack: on use
}


def rollout_function(name: str):
    """A built-in class by name, or a user's class or function by its path ``module:name``."""
    if name in ROLLOUT_FUNCTIONS:
        found = ROLLOUT_FUNCTIONS[name]
        return import_function(found, "rollout_function") if isinstance(found, str) else found
    if ":" not in name and "." not in name:
        raise ValueError(
            f"unknown rollout_function {name!r}; built in: {', '.join(ROLLOUT_FUNCTIONS)}, "
            "or a RolloutFunction class or a function as 'module:name'"
        )
    return import_function(name, "rollout_function")


def is_whole_batch(found) -> bool:
    """Whether a resolved rollout function is a user's whole-batch function (not a RolloutFunction class)."""
    return not (inspect.isclass(found) and issubclass(found, RolloutFunction))


def build_rollout_function(name: str, context: AgentContext) -> RolloutFunction:
    found = rollout_function(name)
    return WholeBatch(context, found) if is_whole_batch(found) else found(context)
