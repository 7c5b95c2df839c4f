"""Built-in rule verifiers.

- acc_for_ppo (alias gsm8k, math): 1 when the response's final answer equals the label.
  The answer is taken from the last \\boxed{...}, else after the last '####', else the last
  number; equality is numeric when both sides are numbers, else math-verify's symbolic check, limited to
  ``SYMBOLIC_CPU_SECONDS`` of CPU time (not wall time: a host busy with other work cannot fail a quick parse).
- format: 1 when the response has the <think>...</think><answer>...</answer> shape anywhere.
- strict_format: 1 when the whole response is exactly that shape.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import threading
from typing import Callable, Iterator, Optional

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.S)
_STRICT_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.S)
# math-verify's own limits are wall-clock alarms (2 s each once failed "$1/2$" on a loaded host); ours counts the
# CPU time the comparison takes, and stays under the rule-reward runner's per-sample timeout (10 s by default)
SYMBOLIC_CPU_SECONDS = 5.0


def last_boxed(text: str) -> Optional[str]:
    """Content of the last \\boxed{...}, braces balanced."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def extract_answer(text: str) -> Optional[str]:
    """The final answer of a response: \\boxed{} > text after '####' > the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        if tail:
            return tail.splitlines()[0].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _as_number(text: str) -> Optional[float]:
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


def answer_key(answer: Optional[str]) -> Optional[str]:
    """What equal final answers share, for counting votes (maj@k): a number in one spelling ("1,000.0" and
    "1000" agree), other text stripped of surrounding space and a final period; None for no answer."""
    if answer is None or not answer.strip():
        return None
    number = _as_number(answer)
    return repr(number) if number is not None else answer.strip().rstrip(".").strip()


def answers_match(answer: str, label: str) -> bool:
    a, b = _as_number(answer), _as_number(label)
    if a is not None and b is not None:
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    if answer.strip() == label.strip():
        return True
    if threading.current_thread() is not threading.main_thread():
        return False  # the CPU-time limit is a signal, which only the main thread receives
    from math_verify import parse, verify

    try:
        with cpu_time_limit(SYMBOLIC_CPU_SECONDS) as over:
            gold, given = parse(f"${label}$", parsing_timeout=None), parse(f"${answer}$", parsing_timeout=None)
            same = bool(verify(gold, given, timeout_seconds=None))
        return same and not over()  # math-verify catches what it raises, and may answer after the limit
    except Exception:  # noqa: BLE001 - an unparsable answer, or one too costly to compare, is simply wrong
        return False


@contextlib.contextmanager
def cpu_time_limit(seconds: float) -> Iterator[Callable[[], bool]]:
    """Raises TimeoutError inside the block once this process has computed ``seconds`` of CPU time in it, and
    again every 50 ms of CPU after that, so code that catches it cannot run on (ITIMER_VIRTUAL: time spent waiting
    for a core does not count). Yields a function saying whether the limit was reached. Main thread only."""
    fired = []

    def stop(signum, frame):
        fired.append(True)
        raise TimeoutError(f"over {seconds} s of CPU time")

    previous = signal.signal(signal.SIGVTALRM, stop)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds, 0.05)
    try:
        yield lambda: bool(fired)
    finally:
        while True:  # the timer may fire once more before it is off
            try:
                signal.setitimer(signal.ITIMER_VIRTUAL, 0)
                signal.signal(signal.SIGVTALRM, previous)
                break
            except TimeoutError:
                continue


class _DropTimeoutDisabled(logging.Filter):
    """math-verify warns once that its timeouts are off; ``cpu_time_limit`` is the one it asks for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):  # once per process, at import
    logging.getLogger(_name).addFilter(_DropTimeoutDisabled())


def accuracy(response: str, label: str) -> float:
    """1 when the response's final answer equals the label, else 0 (MindSpeed-RL's base_acc too)."""
    answer = extract_answer(response)
    if answer is None or label is None:
        return 0.0
    return 1.0 if answers_match(answer, str(label)) else 0.0


def accuracy_plus_minus(response: str, label: str) -> float:
    """DAPO's rule reward: +1 for a right final answer, -1 otherwise."""
    return 2.0 * accuracy(response, label) - 1.0


def format_reward(response: str, label: str) -> float:
    return 1.0 if _FORMAT.search(response) else 0.0


def strict_format_reward(response: str, label: str) -> float:
    return 1.0 if _STRICT_FORMAT.match(response) else 0.0


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def tagged_answer(text: str) -> Optional[str]:
    """The final answer as reasoning-gym's tasks expect it: the last <answer>...</answer> (its \\boxed{} if it
    holds one), else \\boxed{} or the text after '####'."""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        inner = tags[-1].strip()
        return last_boxed(inner) or inner
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    return None


def reasoning_gym_score(response: str, label: str) -> float:
    """The reasoning-gym task's own scorer on the response's answer; ``label`` is the task's entry as JSON
    (cli/reasoning_gym_tasks.py writes it): {"task", "answer", "metadata"}."""
    import json

    import reasoning_gym

    try:
        entry = json.loads(label)
        task = entry["task"]
    except (ValueError, TypeError, KeyError):
        raise ValueError("the reasoning_gym verifier's label is a task entry as JSON (cli/reasoning_gym_tasks.py)")
    answer = tagged_answer(response)
    if answer is None:
        return 0.0
    return min(1.0, max(0.0, float(reasoning_gym.get_score_answer_fn(task)(answer, entry))))  # (1 + 2e-16 seen)
