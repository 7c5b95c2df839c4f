"""The demo's generative judge: a tiny causal LM fine-tuned here to grade the lucky-number task, so that a GRPO run
rewarded by a judge alone (grpo_tiny_cpu_judge) can be shown on this CPU.

Its examples are the judge's prompt (``TEMPLATE``: the question, a response shaped like a policy's samples, the
label) followed by its answer "Score 1" or "Score 0" (judge_config score_max 1), as the rule verifier would grade
the response; the tokenizer is the demo's (it has no ':'; hence ``SCORE_PATTERN``).
"""

from __future__ import annotations

import os
import random
from typing import List, Tuple

from .assets import WORDS, make_rows, prepare

TEMPLATE = "{prompt}\n{response}\nLucky number is {label}.\nGrade 0 or 1\n"
SCORE_PATTERN = r"score\s*(\d+)"


def judge_answer(response: str, label: str) -> str:
    """What the judge should answer: the rule verifier's verdict as a 0-1 grade."""
    from ..rewards.verifiers import accuracy

    return "Score 1" if accuracy(response, label) else "Score 0"


def sample_response(tokenizer, rng: random.Random) -> str:
    """A response like a policy's: random tokens (the initial policy), or words and digits ending in a number, 7
    in about half of them (a policy that learns)."""
    if rng.random() < 0.4:
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 16))]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return text + (" 7." if rng.random() < 0.3 else "")
    body = " ".join(rng.choice(WORDS + [str(d) for d in range(10)]) for _ in range(rng.randint(0, 6)))
    ending = rng.choice(["7", "7", "7", str(rng.randint(0, 9)), ""])
    return f"{body} {ending}.".strip()


def judge_examples(tokenizer, rows: List[dict], rng: random.Random) -> List[Tuple[List[int], List[int]]]:
    """(ids, loss mask) of the judge's fine-tuning examples: the loss on its answer (and EOS) only."""
    from ..rewards.judge import render

    examples = []
    for row in rows:
        response = sample_response(tokenizer, rng)
        prompt = render(TEMPLATE, row["question"], response, "7")
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        answer_ids = tokenizer.encode(judge_answer(response, "7"), add_special_tokens=False)
        answer_ids.append(tokenizer.eos_token_id)
        examples.append((prompt_ids + answer_ids, [0] * len(prompt_ids) + [1] * len(answer_ids)))
    return examples


def prepare_judge(root: str, model, steps: int = 900, batch: int = 32, lr: float = 3e-3, seed: int = 1) -> str:
    """<root>/tiny_judge_hf: a new HF model of ``model``'s shape fine-tuned on ``judge_examples``; returns its
    folder. Idempotent."""
    from transformers import AutoTokenizer

    from .tiny_hf import build_hf_model
    from .tool_task import cold_start

    paths = prepare(root, model.padded_vocab_size, seed=seed)
    out = os.path.join(root, "tiny_judge_hf")
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    tokenizer = AutoTokenizer.from_pretrained(paths["tokenizer"])
    rng = random.Random(seed + 11)
    examples = judge_examples(tokenizer, make_rows(4000, seed + 11), rng)
    staging = out + ".tmp"
    build_hf_model(staging, model, seed=seed + 11, tokenizer_dir=paths["tokenizer"])
    cold_start(staging, tokenizer, examples, steps, batch=batch, lr=lr, seed=seed)
    os.replace(staging, out)
    return out
