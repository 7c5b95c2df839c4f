"""In-flight weight updates: an engine that generates step by step and lets new weights in between two steps.

    gate = PauseGate()
    # the generating thread                       # the weight thread (rollout worker, another Ray thread)
    with gate.stepping() as recompute:            gate.pause(timeout)     # returns once no step runs
        engine.step()                             ...load the new weights...
                                                  gate.resume(recompute)  # the requests go on

The requests stay in the engine across the pause: their KV cache is kept (the tokens after the update attend to
keys and values the old weights computed), or recomputed under the new weights when the resume asks for it
(vLLM's preemption of the running requests where the release has it, else each request aborted and resubmitted
with its generated tokens as a longer prompt; ``compat/vllm.py``). Every token records the policy version of
the weights that sampled it: the version the engine held during the step that returned it.

``StepLoop`` drives vLLM's ``LLMEngine`` (``add_request`` / ``step``, outputs as deltas) with a gate; an engine
without steps (the megatron-core fallback) passes the gate once per generate call, so an update waits for the
call to end.
"""

from __future__ import annotations

import copy
import itertools
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

from ...compat import vllm as compat_vllm


class PauseGate:
    """Between two steps of the generating thread: closed by ``pause`` (which returns once no step runs),
    opened by ``resume``. A step waits while the gate is closed; the first step after a resume is told whether
    the KV cache of the requests in flight is to be recomputed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._stepping = False
        self._recompute = False

    @contextmanager
    def stepping(self) -> Iterator[bool]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._stepping = True
            recompute, self._recompute = self._recompute, False
        try:
            yield recompute
        finally:
            with self._cond:
                self._stepping = False
                self._cond.notify_all()

    def pause(self, timeout: float) -> bool:
        """Close the gate and wait (at most ``timeout`` s) until the step in progress ends; False (and the gate
        open again) when it did not."""
        with self._cond:
            self._closed = True
            if self._cond.wait_for(lambda: not self._stepping, timeout):
                return True
            self._closed = False
            self._cond.notify_all()
            return False

    def resume(self, recompute: bool = False) -> None:
        with self._cond:
            self._recompute = self._recompute or recompute
            self._closed = False
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

    def __init__(self, gate: PauseGate, version: Callable[[], int]) -> None:
        self.gate, self.version = gate, version
        self.recomputes = 0  # resumes that recomputed the KV cache of the requests in flight

    def run(self, engine, prompts: List[Dict], params: List) -> List[Completion]:
        """Every (prompt, params) to its end; ``prompts`` as vLLM's token prompts (``prompt_token_ids``)."""
        running: Dict[str, Completion] = {}
        done: List[Completion] = []
        for index, (prompt, sampling) in enumerate(zip(prompts, params)):
            self._add(engine, running, Completion(index, list(prompt["prompt_token_ids"]), sampling), prompt)
        while running:
            with self.gate.stepping() as recompute:
                if recompute:
                    self._recompute(engine, running)
                version = self.version()
                outputs = engine.step()
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
        return sorted(done, key=lambda c: c.index)

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
        self.recomputes += 1
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
