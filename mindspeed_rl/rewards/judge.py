"""Generative judge: a model grades each response through a prompt template, and the score is parsed from its
answer. A failed request (down, slow, an HTTP error after the retries) or an answer without a score is scored
``on_failure`` and counted, never a dead run: every request has a timeout, so nothing waits forever.

    judge prompt = template.format(prompt=..., response=..., label=...)
    score = (s - score_min) / (score_max - score_min)  in [0, 1],  s = the last number after "Score:" (or \\boxed{})

Nothing a judge sends can stall or exhaust the driver: the score is looked for in the last ``PARSE_WINDOW``
characters of an answer, the built-in patterns run in linear time, a user's ``score_pattern`` gets at most
``PARSE_SECONDS`` (and no more than the call's deadline leaves), and an HTTP answer is read as a stream that
stops at ``max_response_bytes`` as decoded (a gzip body inflated a bounded step at a time) or at the request's
``timeout`` in wall-clock time (http_body.py).

Serving: :class:`HttpJudge` talks to any OpenAI-compatible endpoint (vLLM's server, a hosted API) with
``concurrency`` requests in flight; :class:`EngineJudge` asks the judge's own vLLM engines (workers/judge_worker.py).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import regex  # re's twin with a time limit per search (a dependency of transformers)

from .http_body import bounded_transport, too_large

DEFAULT_TEMPLATE = (
    "You grade answers to questions.\n\n"
    "Question:\n{prompt}\n\n"
    "Reference answer: {label}\n\n"
    "Answer to grade:\n{response}\n\n"
    "Is the answer correct and well reasoned? Give a score from 0 (wrong) to 10 (correct). "
    "End your reply with a line 'Score: <number>'."
)
# one character class between "score:" and the number, not `\s*\**\s*`: that backtracked quadratically over a
# run of spaces (9 s for 20,000)
SCORE_PATTERN = r"score\s*[:=][\s*]*(-?\d+(?:\.\d+)?)"
BOXED = r"\\boxed\{\s*(-?\d+(?:\.\d+)?)\s*\}"
PARSE_WINDOW = 8192  # characters at the end of an answer searched for the score
PARSE_SECONDS = 0.5  # the most one answer's search may take

# why a response got on_failure instead of a parsed score
REQUEST_FAILED = "request_failed"  # connection refused, timeout, HTTP error (after the retries)
NO_SCORE = "no_score"  # the answer holds no score
OUT_OF_RANGE = "out_of_range"  # a score outside [score_min, score_max]
PARSE_TIMEOUT = "parse_timeout"  # the score_pattern's search took longer than it may
OVERSIZED = "oversized"  # the endpoint's answer was longer than max_response_bytes (counted as a failed request)


@dataclass(frozen=True)
class Failed:
    """An answer that did not come, and why (a serving way's ``_answers`` may return it instead of None)."""

    why: str


@dataclass
class Verdict:
    score: float  # in [0, 1], or on_failure
    reply: str  # the judge's answer ('' when the request failed)
    failure: Optional[str] = None  # REQUEST_FAILED, NO_SCORE, OUT_OF_RANGE or None


def render(template: str, prompt: str, response: str, label: str = "") -> str:
    """The judge's prompt: ``template`` with {prompt}, {response} and {label} filled in (other braces literal)."""
    values = {"prompt": prompt, "response": response, "label": label}
    return re.sub(r"\{(prompt|response|label)\}", lambda m: values[m.group(1)], template)


def parse_score(
    reply: str,
    score_min: float = 0.0,
    score_max: float = 10.0,
    pattern: str = SCORE_PATTERN,
    seconds: float = PARSE_SECONDS,
) -> Tuple[Optional[float], Optional[str]]:
    """(score in [0, 1], None) from the last "Score: s" (case-insensitive; else the last \\boxed{s}) in the last
    PARSE_WINDOW characters of ``reply``, or (None, why); the search gives up after ``seconds``."""
    tail = reply[-PARSE_WINDOW:]
    try:
        found = regex.findall(pattern, tail, flags=regex.IGNORECASE, timeout=seconds) or regex.findall(
            BOXED, tail, timeout=seconds
        )
    except TimeoutError:
        return None, PARSE_TIMEOUT
    if not found:
        return None, NO_SCORE
    last = found[-1]
    try:
        value = float(last[0] if isinstance(last, tuple) else last)
    except ValueError:  # a score_pattern whose group caught something else
        return None, NO_SCORE
    if not math.isfinite(value) or not score_min <= value <= score_max:
        return None, OUT_OF_RANGE
    return (value - score_min) / (score_max - score_min), None


class Judge:
    """What every way of serving a judge shares: the template, the parsing, the failure handling and the
    metrics. A serving way answers ``_answers(texts)``: one reply per judge prompt, None where the request
    failed (after its own retries and timeouts)."""

    def __init__(
        self,
        template: str = DEFAULT_TEMPLATE,
        score_min: float = 0.0,
        score_max: float = 10.0,
        on_failure: float = 0.0,
        max_tokens: int = 512,
        temperature: float = 0.0,
        score_pattern: Optional[str] = None,
        deadline: Optional[float] = None,
    ):
        self.template, self.score_min, self.score_max, self.on_failure = template, score_min, score_max, on_failure
        self.max_tokens, self.temperature = max_tokens, temperature
        self.score_pattern = score_pattern or SCORE_PATTERN
        self.deadline = deadline  # seconds for one grade() call, answers and parsing together (None: no limit)

    def _answers(self, texts: Sequence[str]) -> "List[Optional[str | Failed]]":
        raise NotImplementedError

    def _verdicts(self, texts: Sequence[str], until: Optional[float]) -> List[Verdict]:
        """One verdict per judge prompt: the answers, then each parsed before ``until``."""
        return [self.verdict(reply, until) for reply in self._answers(texts)]

    def verdict(self, reply: "Optional[str | Failed]", until: Optional[float] = None) -> Verdict:
        """The verdict on one answer (None: the request failed; a ``Failed``: why it did not come), parsed before
        the monotonic time ``until``."""
        if reply is None or isinstance(reply, Failed):
            return Verdict(self.on_failure, "", REQUEST_FAILED if reply is None else reply.why)
        seconds = PARSE_SECONDS if until is None else min(PARSE_SECONDS, until - time.monotonic())
        if seconds <= 0:
            return Verdict(self.on_failure, reply, PARSE_TIMEOUT)
        score, why = parse_score(reply, self.score_min, self.score_max, self.score_pattern, seconds)
        return Verdict(self.on_failure if score is None else score, reply, why)

    def grade(
        self, prompts: Sequence[str], responses: Sequence[str], labels: Sequence[str]
    ) -> Tuple[List[Verdict], Dict[str, float]]:
        """Every response's verdict, and the metrics judge/score_mean, judge/request_failures (oversized answers
        included), judge/parse_failures (no score, out of range, or the search out of time) and timing/judge."""
        start = time.perf_counter()
        until = None if self.deadline is None else time.monotonic() + self.deadline
        texts = [render(self.template, p, r, lab) for p, r, lab in zip(prompts, responses, labels)]
        verdicts = self._verdicts(texts, until) if texts else []
        failed = sum(v.failure is not None for v in verdicts)
        if verdicts and failed == len(verdicts):
            self.warn_all_failed(verdicts)
        scores = [v.score for v in verdicts]
        metrics = {
            "judge/score_mean": sum(scores) / len(scores) if scores else 0.0,
            "judge/request_failures": float(sum(v.failure in (REQUEST_FAILED, OVERSIZED) for v in verdicts)),
            "judge/parse_failures": float(sum(v.failure in (NO_SCORE, OUT_OF_RANGE, PARSE_TIMEOUT) for v in verdicts)),
            "timing/judge": time.perf_counter() - start,
        }
        return verdicts, metrics

    def warn_all_failed(self, verdicts: Sequence[Verdict]) -> None:
        """Once a minute at most: every verdict of a call failed, so the judge's reward is on_failure everywhere."""
        now = time.monotonic()
        if now - getattr(self, "_warned_at", -1e9) < 60:
            return
        self._warned_at = now
        why = verdicts[0].failure
        reply = f"; e.g. the answer {verdicts[0].reply[:80]!r}" if verdicts[0].reply else ""
        print(
            f"warning: judge: all {len(verdicts)} verdicts of a call failed ({why}{reply}): they score on_failure "
            f"{self.on_failure}; check the endpoint or engines and judge_config.score_pattern",
            flush=True,
        )

    def close(self) -> None:
        """Release what the serving way holds (nothing here)."""


class HttpJudge(Judge):
    """An OpenAI-compatible endpoint as the judge: ``base_url`` (…/v1), ``model``, ``api`` chat (the server applies
    the model's chat template) or completions (the text as it is), at most ``concurrency`` requests in flight,
    each given ``timeout`` seconds (its body too, in wall-clock time) and ``retries`` more tries, all of one call
    given ``deadline`` seconds (a hung server would otherwise cost timeout x (retries + 1) per wave of requests); at
    most ``max_response_bytes`` of each answer is read, counted as decoded (None: 16 bytes per max_tokens + 64 KiB
    of JSON around them), a longer one is a failed request; the API key from the environment variable
    ``api_key_env`` (a local server takes any)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        template: str = DEFAULT_TEMPLATE,
        concurrency: int = 8,
        timeout: float = 60.0,
        retries: int = 2,
        max_tokens: int = 512,
        score_min: float = 0.0,
        score_max: float = 10.0,
        on_failure: float = 0.0,
        api_key_env: str = "OPENAI_API_KEY",
        api: str = "chat",
        temperature: float = 0.0,
        score_pattern: Optional[str] = None,
        deadline: Optional[float] = None,
        max_response_bytes: Optional[int] = None,
    ):
        super().__init__(template, score_min, score_max, on_failure, max_tokens, temperature, score_pattern, deadline)
        self.base_url, self.model, self.api = base_url, model, api
        self.concurrency, self.timeout, self.retries = concurrency, timeout, retries
        self.max_response_bytes = max_response_bytes or default_response_bytes(max_tokens)
        self.api_key = os.environ.get(api_key_env) or "EMPTY"

    async def _ask(self, client, gate: asyncio.Semaphore, text: str, until: Optional[float]) -> Verdict:
        """The verdict on one prompt, parsed as soon as its answer is in (so within the call's deadline)."""
        return self.verdict(await self._answer(client, gate, text), until)

    async def _answer(self, client, gate: asyncio.Semaphore, text: str) -> "Optional[str | Failed]":
        async with gate:
            try:
                if self.api == "completions":
                    done = await client.completions.create(
                        model=self.model, prompt=text, temperature=self.temperature, max_tokens=self.max_tokens
                    )
                    return done.choices[0].text or ""
                reply = await client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": text}],
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                )
                return reply.choices[0].message.content or ""
            except Exception as exc:  # the endpoint's failures of every kind (openai's, httpx's, a malformed body)
                return Failed(OVERSIZED) if too_large(exc) else None

    async def _ask_all(self, texts: Sequence[str], until: Optional[float]) -> List[Verdict]:
        import httpx
        from openai import AsyncOpenAI

        transport = bounded_transport(self.max_response_bytes, self.timeout, until)
        client = AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            max_retries=self.retries,
            http_client=httpx.AsyncClient(transport=transport, timeout=self.timeout),
        )
        gate = asyncio.Semaphore(self.concurrency)
        tasks = [asyncio.ensure_future(self._ask(client, gate, t, until)) for t in texts]
        try:
            await asyncio.wait(tasks, timeout=None if until is None else max(0.0, until - time.monotonic()))
            for task in tasks:  # past the call's deadline: failed requests (counted), the batch goes on
                if not task.done():
                    task.cancel()
            return [task.result() if task.done() and not task.cancelled() else self.verdict(None) for task in tasks]
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()

    def _verdicts(self, texts: Sequence[str], until: Optional[float]) -> List[Verdict]:
        return asyncio.run(self._ask_all(texts, until))


def default_response_bytes(max_tokens: int) -> int:
    """What an answer of ``max_tokens`` tokens can take as an HTTP body: 16 bytes a token (a token is a few
    characters, JSON escapes one up to six bytes each) plus 64 KiB for the JSON around it."""
    return 16 * max_tokens + (64 << 10)


class EngineJudge(Judge):
    """The judge on engines of its own: ``generate(texts, max_tokens, temperature)`` returns one reply per text, None
    where it could not ask (the driver's call into the judge's worker group: trainer/ppo/judging.py)."""

    def __init__(self, generate: Callable[[Sequence[str], int, float], List[Optional[str]]], **kwargs):
        super().__init__(**kwargs)
        self.generate = generate

    def _answers(self, texts: Sequence[str]) -> List[Optional[str]]:
        return list(self.generate(texts, self.max_tokens, self.temperature))


def load_template(template: Optional[str], template_file: Optional[str]) -> str:
    """The configured template: given inline, read from a file, or the built-in one."""
    if template_file:
        with open(template_file, encoding="utf-8") as fh:
            return fh.read()
    return template if template is not None else DEFAULT_TEMPLATE


__all__ = [
    "DEFAULT_TEMPLATE",
    "EngineJudge",
    "Failed",
    "HttpJudge",
    "Judge",
    "Verdict",
    "default_response_bytes",
    "load_template",
    "parse_score",
    "render",
]
