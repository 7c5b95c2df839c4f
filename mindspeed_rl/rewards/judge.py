"""Generative judge: a model grades each response through a prompt template, and the score is parsed from its
answer. A failed request (down, slow, an HTTP error after the retries) or an answer without a score is scored
``on_failure`` and counted, never a dead run: every request has a timeout, so nothing waits forever.

    judge prompt = template.format(prompt=..., response=..., label=...)
    score = (s - score_min) / (score_max - score_min)  in [0, 1],  s = the last number after "Score:" (or \\boxed{})

Serving: :class:`HttpJudge` talks to any OpenAI-compatible endpoint (vLLM's server, a hosted API) with
``concurrency`` requests in flight.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

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
    found = re.findall(pattern, reply, flags=re.IGNORECASE) or BOXED.findall(reply)
    if not found:
        return None, NO_SCORE
    value = float(found[-1])
    if not math.isfinite(value) or not score_min <= value <= score_max:
        return None, OUT_OF_RANGE
    return (value - score_min) / (score_max - score_min), None


class HttpJudge:
    """An OpenAI-compatible chat endpoint as the judge: ``base_url`` (…/v1), ``model``, at most ``concurrency``
    requests in flight, each given ``timeout`` seconds and ``retries`` more tries; the API key from the
    environment variable ``api_key_env`` (a local server takes any)."""

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
    ):
        self.base_url, self.model, self.template = base_url, model, template
        self.concurrency, self.timeout, self.retries, self.max_tokens = concurrency, timeout, retries, max_tokens
        self.score_min, self.score_max, self.on_failure = score_min, score_max, on_failure
        self.api_key = os.environ.get(api_key_env) or "EMPTY"

    async def _ask(self, client, gate: asyncio.Semaphore, text: str) -> Verdict:
        async with gate:
            try:
                reply = await client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": text}],
                    temperature=0.0,
                    max_tokens=self.max_tokens,
                )
                content = reply.choices[0].message.content or ""
            except Exception:  # the endpoint's failures of every kind (openai's, httpx's, a malformed body)
                return Verdict(self.on_failure, "", REQUEST_FAILED)
        score, why = parse_score(content, self.score_min, self.score_max)
        return Verdict(self.on_failure if score is None else score, content, why)

    async def _grade(self, texts: Sequence[str]) -> List[Verdict]:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=self.retries
        )
        gate = asyncio.Semaphore(self.concurrency)
        try:
            return list(await asyncio.gather(*(self._ask(client, gate, t) for t in texts)))
        finally:
            await client.close()

    def grade(
        self, prompts: Sequence[str], responses: Sequence[str], labels: Sequence[str]
    ) -> Tuple[List[Verdict], Dict[str, float]]:
        """Every response's verdict, and the metrics judge/score_mean, judge/request_failures,
        judge/parse_failures (no score or out of range) and timing/judge."""
        start = time.perf_counter()
        texts = [render(self.template, p, r, lab) for p, r, lab in zip(prompts, responses, labels)]
        verdicts = asyncio.run(self._grade(texts)) if texts else []
        scores = [v.score for v in verdicts]
        metrics = {
            "judge/score_mean": sum(scores) / len(scores) if scores else 0.0,
            "judge/request_failures": float(sum(v.failure == REQUEST_FAILED for v in verdicts)),
            "judge/parse_failures": float(sum(v.failure in (NO_SCORE, OUT_OF_RANGE) for v in verdicts)),
            "timing/judge": time.perf_counter() - start,
        }
        return verdicts, metrics


__all__ = ["DEFAULT_TEMPLATE", "HttpJudge", "Verdict", "parse_score", "render"]
