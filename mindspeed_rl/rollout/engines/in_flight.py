"""In-flight weight updates: an engine that generates step by step and lets new weights in between two steps.

    gate = PauseGate()
    # the generating thread                            # the weight thread (rollout worker, another Ray thread)
    with gate.generating():                            gate.pause(timeout)   # returns once the loop is held
        while requests:                                ...load the new weights...
            recompute = gate.hold_point(agree)         gate.resume(recompute)
            engine.step()

The loop is held at a hold point while the gate is closed. The ranks of one engine (infer TP > 1) step together, so
they must hold at the same step: ``agree`` broadcasts the decision of the engine's first rank (its gate closed or
not) to every rank before each step, and a rank holds when its first rank's gate is closed; ``pause`` returns
only once its own loop is held (or generates nothing), so no rank loads while a step of its engine runs.

The requests stay in the engine across the pause: their KV cache is kept (the tokens after the update attend to
keys and values the old weights computed), or recomputed under the new weights when the resume asks for it
(vLLM's preemption of the running requests where the release has it, else each request aborted and resubmitted
with its generated tokens as a longer prompt; ``compat/vllm.py``). Every token records the policy version of
the weights that sampled it: the version the engine held during the step that returned it.

``StepLoop`` drives vLLM's ``LLMEngine`` (``add_request`` / ``step``, outputs as deltas) through a gate; an engine
without steps (the megatron-core fallback) has one hold point per generate call, so an update waits for the call
to end.
"""

from __future__ import annotations

import copy
import itertools
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

from ...compat import vllm as compat_vllm

Agree = Callable[[bool], bool]  # this rank's "my gate is closed" -> the engine's first rank's


class PauseGate:
    """Where a generating thread may be held between two steps (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False  # a generation runs and is not held
        self._recompute = False
        self._resumes = 0

    @contextmanager
    def generating(self) -> Iterator[None]:
        """Around a generation: ``pause`` waits while it runs and is not held."""
        with self._cond:
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def hold_point(self, agree: Optional[Agree] = None) -> bool:
        """Before a step: held while the gate (the engine's first rank's, through ``agree``) is closed, until this
        rank's resume; returns whether that resume asks for the KV cache to be recomputed."""
        with self._cond:
            seen, closed = self._resumes, self._closed
        if not (agree(closed) if agree is not None else closed):
            return False
        with self._cond:
            self._busy = False
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._resumes > seen)
            self._busy = True
            recompute, self._recompute = self._recompute, False
        return recompute

    def pause(self, timeout: float) -> bool:
        """Close the gate and wait (at most ``timeout`` s) until the generation is held or there is none; False
        (and the gate open again) when it was not."""
        with self._cond:
            self._closed = True
            if self._cond.wait_for(lambda: not self._busy, timeout):
                return True
            self._closed = False
            self._cond.notify_all()
            return False

    def resume(self, recompute: bool = False) -> None:
        with self._cond:
            self._recompute = self._recompute or recompute
            self._closed = False
            self._resumes += 1
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._closed


@dataclass
class Completion:
    """One request's answer, assembled from its deltas: tokens, their log-probs and the version of each."""

    index: int
    prompt: List[int]
    params: Any  # vLLM SamplingParams
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    resubmits: int = 0


_REQUEST_IDS = itertools.count()


class StepLoop:
    """vLLM's engine driven one step at a time through a gate (see the module docstring)."""

    def __init__(self, gate: PauseGate, version: Callable[[], int], agree: Optional[Agree] = None) -> None:
        self.gate, self.version, self.agree = gate, version, agree

    def run(self, engine, prompts: List[Dict], params: List) -> List[Completion]:
        """Every (prompt, params) to its end; ``prompts`` as vLLM's token prompts (``prompt_token_ids``)."""
        running: Dict[str, Completion] = {}
        done: List[Completion] = []
        for index, (prompt, sampling) in enumerate(zip(prompts, params)):
            self._add(engine, running, Completion(index, list(prompt["prompt_token_ids"]), sampling), prompt)
        with self.gate.generating():
            while running:
                if self.gate.hold_point(self.agree):
                    self._recompute(engine, running)
                version = self.version()
                self._absorb(engine.step(), version, running, done)
        return sorted(done, key=lambda c: c.index)

    @staticmethod
    def _absorb(outputs, version: int, running: Dict[str, Completion], done: List[Completion]) -> None:
        """One step's deltas into their completions (finished ones move to ``done``)."""
        for out in outputs:
            item = running.get(out.request_id)
            if item is None:
                continue
            completion = out.outputs[0]
            new = list(completion.token_ids)
            item.tokens += new
            item.logprobs += [entry[token].logprob for entry, token in zip(completion.logprobs or [], new)]
            item.versions += [version] * len(new)
            if out.finished:
                item.finish_reason = completion.finish_reason
                done.append(running.pop(out.request_id))

    def _add(self, engine, running: Dict[str, Completion], item: Completion, prompt: Dict) -> None:
        from vllm.sampling_params import RequestOutputKind

        params = copy.copy(item.params)
        params.output_kind = RequestOutputKind.DELTA
        if item.tokens:  # a resubmission: the generated tokens become prompt, the budget shrinks
            prompt = {**prompt, "prompt_token_ids": item.prompt + item.tokens}
            params.max_tokens = params.max_tokens - len(item.tokens)
            params.min_tokens = max(0, params.min_tokens - len(item.tokens))
            if params.seed is not None:  # another draw than the first attempt's first token
                params.seed = (params.seed + 0x9E3779B1 * item.resubmits) % 2**31
        request_id = f"inflight-{next(_REQUEST_IDS)}"
        engine.add_request(request_id, prompt, params)
        running[request_id] = item

    def _recompute(self, engine, running: Dict[str, Completion]) -> None:
        """The KV cache of the requests in flight, recomputed under the weights just loaded."""
        if compat_vllm.preempt_running_requests(engine):
            return
        # abort and resubmit: the tokens generated so far are kept (with their versions) as prompt
        items = list(running.items())
        engine.abort_request([request_id for request_id, _ in items])
        running.clear()
        engine.reset_prefix_cache()
        for _, item in items:
            item.resubmits += 1
            self._add(engine, running, item, {"prompt_token_ids": item.prompt})
