"""Generative judge: a model grades each response through a prompt template, and the score is parsed from its
answer. A failed request (down, slow, an HTTP error after the retries) or an answer without a score is scored
``on_failure`` and counted, never a dead run: every request has a timeout, so nothing waits forever.

    judge prompt = template.format(prompt=..., response=..., label=...)
    score = (s - score_min) / (score_max - score_min)  in [0, 1],  s = the last number after "Score:" (or \\boxed{})

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

DEFAULT_TEMPLATE = (
    "You grade answers to questions.\n\n"
    "Question:\n{prompt}\n\n"
    "Reference answer: {label}\n\n"
    "Answer to grade:\n{response}\n\n"
    "Is the answer correct and well reasoned? Give a score from 0 (wrong) to 10 (correct). "
    "End your reply with a line 'Score: <number>'."
)
SCORE_PATTERN = r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)"
BOXED = re.compile(r"\\boxed\{\s*(-?\d+(?:\.\d+)?)\s*\}")

# why a response got on_failure instead of a parsed score
REQUEST_FAILED = "request_failed"  # connection refused, timeout, HTTP error (after the retries)
NO_SCORE = "no_score"  # the answer holds no score
OUT_OF_RANGE = "out_of_range"  # a score outside [score_min, score_max]


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
    reply: str, score_min: float = 0.0, score_max: float = 10.0, pattern: str = SCORE_PATTERN
) -> Tuple[Optional[float], Optional[str]]:
    """(score in [0, 1], None) from the last "Score: s" (case-insensitive; else the last \\boxed{s}) of
    ``reply``, or (None, why)."""
    found = [m.group(1) for m in re.finditer(pattern, reply, flags=re.IGNORECASE)] or BOXED.findall(reply)
    if not found:
        return None, NO_SCORE
    try:
        value = float(found[-1])
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
    ):
        self.template, self.score_min, self.score_max, self.on_failure = template, score_min, score_max, on_failure
        self.max_tokens, self.temperature = max_tokens, temperature
        self.score_pattern = score_pattern or SCORE_PATTERN

    def _answers(self, texts: Sequence[str]) -> List[Optional[str]]:
        raise NotImplementedError

    def verdict(self, reply: Optional[str]) -> Verdict:
        if reply is None:
            return Verdict(self.on_failure, "", REQUEST_FAILED)
        score, why = parse_score(reply, self.score_min, self.score_max, self.score_pattern)
        return Verdict(self.on_failure if score is None else score, reply, why)

    def grade(
        self, prompts: Sequence[str], responses: Sequence[str], labels: Sequence[str]
    ) -> Tuple[List[Verdict], Dict[str, float]]:
        """Every response's verdict, and the metrics judge/score_mean, judge/request_failures,
        judge/parse_failures (no score or out of range) and timing/judge."""
        start = time.perf_counter()
        texts = [render(self.template, p, r, lab) for p, r, lab in zip(prompts, responses, labels)]
        verdicts = [self.verdict(reply) for reply in self._answers(texts)] if texts else []
        failed = sum(v.failure is not None for v in verdicts)
        if verdicts and failed == len(verdicts):
            self.warn_all_failed(verdicts)
        scores = [v.score for v in verdicts]
        metrics = {
            "judge/score_mean": sum(scores) / len(scores) if scores else 0.0,
            "judge/request_failures": float(sum(v.failure == REQUEST_FAILED for v in verdicts)),
            "judge/parse_failures": float(sum(v.failure in (NO_SCORE, OUT_OF_RANGE) for v in verdicts)),
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
    each given ``timeout`` seconds and ``retries`` more tries, all of one call given ``deadline`` seconds (a hung
    server would otherwise cost timeout x (retries + 1) per wave of requests); the API key from the environment variable
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
    ):
        super().__init__(template, score_min, score_max, on_failure, max_tokens, temperature, score_pattern)
        self.deadline = deadline
        self.base_url, self.model, self.api = base_url, model, api
        self.concurrency, self.timeout, self.retries = concurrency, timeout, retries
        self.api_key = os.environ.get(api_key_env) or "EMPTY"

    async def _ask(self, client, gate: asyncio.Semaphore, text: str) -> Optional[str]:
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
            except Exception:  # the endpoint's failures of every kind (openai's, httpx's, a malformed body)
                return None

    async def _ask_all(self, texts: Sequence[str]) -> List[Optional[str]]:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=self.retries
        )
        gate = asyncio.Semaphore(self.concurrency)
        tasks = [asyncio.ensure_future(self._ask(client, gate, t)) for t in texts]
        try:
            await asyncio.wait(tasks, timeout=self.deadline)
            for task in tasks:  # past the call's deadline: failed requests (counted), the batch goes on
                if not task.done():
                    task.cancel()
            return [task.result() if task.done() and not task.cancelled() else None for task in tasks]
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()

    def _answers(self, texts: Sequence[str]) -> List[Optional[str]]:
        return asyncio.run(self._ask_all(texts))


class EngineJudge(Judge):
    """The judge on engines of its own: ``generate(texts, max_tokens, temperature)`` returns one reply per text, None
    where it could not ask (the driver's call into the judge's worker group: trainer/judging.py)."""

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


__all__ = ["DEFAULT_TEMPLATE", "EngineJudge", "HttpJudge", "Judge", "Verdict", "load_template", "parse_score", "render"]
