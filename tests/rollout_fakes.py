"""A scripted rollout service and task for the rollout layers' tests (no model, no Ray).

Prompts are ``Q: a*b?``. Each assistant turn starts with a tag chosen by the seed of the round that begins it,
and the tag fixes the whole turn, so a turn continued over chunks reads the same as one generated at once:

    A   answers ``#### 0`` at once (wrong)
    B   thinks for a while ("hmm " x 25), then calls the calculator (the long tail)
    C   calls the calculator
    after a tool result, any tag answers with the result: ``#### <a*b>``
"""

from __future__ import annotations

import json
import random
from typing import Callable, Dict, List

import torch

from mindspeed_rl.config_cls.agent_config import AgentConfig
from mindspeed_rl.datasets.prompt_dataset import PromptBatch
from mindspeed_rl.datasets.templates import ToolFormat
from mindspeed_rl.protocol import GeneratedBatch, RolloutOutput
from mindspeed_rl.rollout.service import RolloutHandle, RolloutService
from mindspeed_rl.rollout.source.agent_loop import AgentContext
from mindspeed_rl.tools import BUILTIN_TOOLS, ToolResult

FORMAT = ToolFormat("\n<user>", "<tool_response>{content}</tool_response>", "</user>\n<assistant>")
EOS = "<eos>"


class CharTokenizer:
    """One token per character: what is generated and what the loop appends can be read back exactly."""

    pad_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)

    def __len__(self):
        return 0x110000


TOK = CharTokenizer()


def call(expression: str) -> str:
    return '<tool_call>{"name": "calculator", "arguments": %s}</tool_call>' % json.dumps({"expression": expression})


def turn_text(context: str, tag: str) -> str:
    if "<tool_response>" in context:
        return tag + "#### " + context.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0] + EOS
    expression = context.split("Q: ", 1)[1].split("?", 1)[0]
    return tag + {"A": "#### 0", "B": "hmm " * 25 + call(expression), "C": call(expression)}[tag] + EOS


def continue_text(context: str, seed: int, tag: str = None) -> str:
    """The rest of the current turn: after the last ``<assistant>``, or after the prompt's ``?``; a new turn's tag
    is drawn with ``seed`` unless given."""
    start = context.rfind("<assistant>")
    start = start + len("<assistant>") if start >= 0 else context.index("?") + 1
    before, partial = context[:start], context[start:]
    tag = partial[0] if partial else tag or random.Random(seed).choice("ABCCC")
    return turn_text(before, tag)[len(partial) :]


def version_logprob(token: int, version: int) -> float:
    """A log-prob that depends on the token and the policy version: stale tokens differ from fresh ones."""
    return -0.01 * (1 + (token + version) % 7)


class ScriptedService(RolloutService):
    """Answers sample k of request row j with ``script(context, seed + j * n + k)`` (by default the task above:
    ``continue_text``), cut at the row's max_new_tokens (finish "length" then), with ``logprob(token, version)``
    per token. Records every request."""

    def __init__(self, script: Callable[[str, int], str] = None, logprob: Callable[[int, int], float] = None):
        super().__init__()
        self.script, self.logprob = script or self.continue_text, logprob or version_logprob
        self.requests: List[object] = []

    def submit(self, request):
        self.requests.append(request)
        outputs = []
        for j, prompt in enumerate(request.prompts):
            for k in range(request.n):
                text = self.script(TOK.decode(prompt), request.seed + j * request.n + k)
                limit = request.max_new_tokens[j] if request.max_new_tokens else request.sampling.max_tokens
                ids = TOK.encode(text)[:limit]
                logprobs = [self.logprob(t, self.version) for t in ids]
                outputs.append(RolloutOutput(j, ids, logprobs, "stop" if len(ids) == len(text) else "length"))
        return RolloutHandle(request, self.version, outputs)

    def continue_text(self, context: str, seed: int) -> str:
        return continue_text(context, seed)

    def collect(self, handle):
        return GeneratedBatch(handle.pending, {"timing/generate": 0.0}, [])


class InProcessSandbox:
    """Runs the calculator in-process (the real sandbox is tested in test_tools), optionally slowly."""

    def __init__(self, delay: float = 0.0):
        self.calls, self.delay, self.windows = [], delay, []

    def run_many(self, calls, parallel=2):
        import time

        from mindspeed_rl.tools.builtin import calculator

        start = time.perf_counter()
        if self.delay:
            time.sleep(self.delay)
        self.calls += list(calls)
        out = []
        for _, arguments in calls:
            try:
                out.append(ToolResult(calculator(**arguments), "ok"))
            except ValueError as exc:
                out.append(ToolResult(f"Error: {exc}", "error"))
        self.windows.append((start, time.perf_counter()))
        return out


def tool_context(sandbox=None, **settings) -> AgentContext:
    return AgentContext(
        None, TOK, {"calculator": BUILTIN_TOOLS["calculator"]}, sandbox or InProcessSandbox(),
        AgentConfig(**settings), FORMAT,
    )  # fmt: skip


def score(exp, clock):
    """1 for a response (its model-written tokens) holding ``#### <the right product>``."""
    values = []
    for ids, mask, label in zip(exp.response_ids, exp.loss_mask, exp.labels):
        text = TOK.decode(ids[mask.bool()].tolist())
        values.append(1.0 if f"#### {label}" in text else 0.0)
    acc = torch.tensor(values)
    exp.set("scores", acc.clone())
    return {"acc/mean": float(acc.mean())}, {"acc": acc}


def prompts_of(count: int, start: int = 0) -> Dict:
    rows = []
    for i in range(start, start + count):
        a, b = 2 + i % 7, 3 + i % 5
        rows.append((TOK.encode(f"Q: {a}*{b}?"), str(a * b)))
    return rows


class SteppingEngine:
    """An engine that generates ``steps`` tokens one step at a time through the worker's pause gate (``step_s``
    seconds each), each token stamped with the version the worker held during its step."""

    name = "stepping"
    tensor_parallel_size = 1

    def __init__(self, steps: int = 40, step_s: float = 0.01):
        self.steps, self.step_s = steps, step_s

    def step_in_flight(self, gate, version):
        self.gate, self.version = gate, version

    def generate(self, request):
        import time

        versions = []
        with self.gate.generating():
            for _ in range(self.steps):
                self.gate.hold_point()
                time.sleep(self.step_s)
                versions.append(self.version())
        rows = len(request.prompts) * request.n
        return [
            RolloutOutput(i // request.n, [1] * self.steps, [0.0] * self.steps, "length", versions) for i in range(rows)
        ]

    def onload(self):
        pass


def stepping_worker_class():
    """A rollout rank (the real RolloutWorker's pause, resume and generate) over a SteppingEngine, whose weight loads
    take 50 ms, fail where told to, and are logged with the resumes (rank, event, time)."""
    import time

    from mindspeed_rl.config_cls import GenerateConfig
    from mindspeed_rl.rollout.engines.in_flight import PauseGate
    from mindspeed_rl.workers.rollout_worker import RolloutWorker

    class SteppingWorker(RolloutWorker):
        """Engine ``engine`` of a fleet: one rank, a world of its own."""

        def __init__(self, engine: int, fail_load: bool = False, step_s: float = 0.01, in_flight: bool = True):
            from mindspeed_rl.workers.fault_injection import FaultPlan

            self.rank, self.world_size, self.engine_size = 0, 1, 1
            self.engine_index, self.engine_rank = engine, 0
            self.gen, self.version, self.channel = GenerateConfig(), 0, None
            self.gate, self.gate_per_call = PauseGate(), False
            self.engine = SteppingEngine(step_s=step_s)
            self.engine.step_in_flight(self.gate, lambda: self.version)
            self.fail_load, self.events, self.garbage = fail_load, [], False
            self.faults = FaultPlan(engine, armed=False)

        def receive_weights(self, version):
            self.events.append((self.engine_index, "load", time.perf_counter()))
            if self.fail_load:
                raise RuntimeError(f"engine {self.engine_index}: the weights did not load")
            time.sleep(0.05)
            self.version = version
            return {}

        def resume_generation(self, recompute=False):
            self.events.append((self.engine_index, "resume", time.perf_counter()))
            super().resume_generation(recompute)

        def answer_garbage(self):
            self.garbage = True

        def generate(self, request, version=None):
            result = super().generate(request, version)
            if self.garbage:
                self.faults.garble(result.outputs)
            return result

        def log(self):
            return self.events, self.gate.paused

    return SteppingWorker


class WeightSender:
    def push_weights(self, engines=None):
        return {"failed": {}}

    def close_weight_channel(self, engine):
        pass


def stepping_fleet(limits=None, engines: int = 2, fail_load: bool = False, step_s: float = 0.01, restarts=True):
    """(the actor's sender, a RolloutFleet of ``engines`` stepping engines as threaded Ray actors, each a group of its
    own; engine 1's load fails with ``fail_load``); restarts start a fresh stepping engine."""
    import ray

    from mindspeed_rl.workers.rollout_fleet import FaultLimits, RolloutFleet
    from mindspeed_rl.workers.rollout_worker import RolloutWorker
    from mindspeed_rl.workers.worker_group import WorkerGroup

    worker = ray.remote(concurrency_groups=RolloutWorker.CONCURRENCY_GROUPS)(stepping_worker_class())

    def start(engine, incarnation=0):
        handle = worker.options(max_concurrency=4).remote(engine, fail_load and engine == 1 and not incarnation, step_s)
        group = WorkerGroup(f"rollout{engine}", [handle])
        if not incarnation:
            group.load_layouts()
        return group

    fleet = RolloutFleet(
        [start(e) for e in range(engines)],
        limits or FaultLimits(),
        vocab_size=1000,
        max_tokens=64,
        respawn=start if restarts else None,
        connect=lambda actor, engine: None,
    )
    return WorkerGroup("actor", [ray.remote(WeightSender).remote()]), fleet


class Draws:
    """Prompt batches of ``size`` prompts in order; its position is the sampler's state."""

    def __init__(self, size: int = 4):
        self.size, self.consumed = size, 0

    def __call__(self):
        rows = prompts_of(self.size, self.consumed)
        self.consumed += self.size
        return PromptBatch([r[0] for r in rows], [r[1] for r in rows])
