"""Assets of the embedded CPU demo, made offline on first use: a tokenizer and a prompt dataset.

The task ("lucky number") rewards a response whose final number is 7, whatever the question
around it: a randomly initialised policy earns it now and then by chance, so PPO has a signal
to climb from scratch, which is what the demo and the learning test show.
"""

from __future__ import annotations

import json
import os
import random
from typing import List, Optional

NAMES = ["Ada", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kai", "Lu", "Mo", "Ned", "Oz", "Pia"]
THINGS = ["apples", "pears", "coins", "books", "cats", "cups", "pens", "stars", "boats", "keys"]
QUESTIONS = [
    "What is the lucky number?",
    "Which number is lucky?",
    "Tell me the lucky number.",
    "Say the lucky number.",
    "Give the lucky number.",
]


def make_rows(count: int, seed: int) -> List[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        question = f"{name} has {a} {thing} and {b} more. {rng.choice(QUESTIONS)}"
        rows.append({"question": question, "answer": "The lucky number is 7.\n#### 7"})
    return rows


def corpus(rows: List[dict], seed: int) -> List[str]:
    rng = random.Random(seed)
    texts = [r["question"] for r in rows] + [r["answer"] for r in rows[:200]]
    texts += [" ".join(str(rng.randint(0, 9)) for _ in range(12)) for _ in range(100)]
    return texts


def prepare(root: str, vocab_size: int, train_rows: int = 2000, seed: int = 1, test_rows: int = 64) -> dict:
    """Write <root>/tiny_qwen25_hf (tokenizer of exactly ``vocab_size`` tokens), the preprocessed prompts
    <root>/data/arith_train* and a held-out test set <root>/data/arith_test* (questions not in the training
    set); returns the paths. Idempotent."""
    from .tiny_hf import build_tokenizer

    tok_dir = os.path.join(root, "tiny_qwen25_hf")
    raw = os.path.join(root, "raw", "lucky_train.jsonl")
    raw_test = os.path.join(root, "raw", "lucky_test.jsonl")
    prefix = os.path.join(root, "data", "arith_train")
    test_prefix = os.path.join(root, "data", "arith_test")
    paths = {"tokenizer": tok_dir, "raw": raw, "raw_test": raw_test, "data_prefix": prefix, "test_prefix": test_prefix}
    rows = make_rows(train_rows, seed)
    if not (os.path.isfile(prefix + "_summary.json") and os.path.isfile(os.path.join(tok_dir, "tokenizer.json"))):
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        with open(raw, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        tok = build_tokenizer(
            tok_dir, corpus(rows, seed), vocab_size=vocab_size, full_alphabet=False, pad_to_vocab=True
        )
        if len(tok) != vocab_size:
            raise RuntimeError(f"demo tokenizer has {len(tok)} tokens, expected {vocab_size}")
        _preprocess(raw, tok_dir, prefix)
    if not os.path.isfile(test_prefix + "_summary.json"):
        seen = {r["question"] for r in rows}
        held_out = [r for r in make_rows(4 * test_rows, seed + 1000) if r["question"] not in seen][:test_rows]
        os.makedirs(os.path.dirname(raw_test), exist_ok=True)
        with open(raw_test, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in held_out)
        _preprocess(raw_test, tok_dir, test_prefix)
    return paths


def prepare_long_tail(
    root: str, vocab_size: int, short: int, long: int, long_every: int = 8, train_rows: int = 2000, seed: int = 1
) -> str:
    """The demo's prompts with a long-tail response budget (dataset key max_new_tokens): every
    ``long_every``-th prompt may answer in ``long`` tokens, the others in ``short``. Returns the data prefix
    (<root>/data/arith_longtail_<short>_<long>_<long_every>); train with
    ``dataset_additional_keys: [labels, max_new_tokens]``. Idempotent."""
    paths = prepare(root, vocab_size, train_rows, seed)
    name = f"arith_longtail_{short}_{long}_{long_every}"
    prefix = os.path.join(root, "data", name)
    if not os.path.isfile(prefix + "_summary.json"):
        raw = os.path.join(root, "raw", name + ".jsonl")
        rows = [
            dict(r, max_new_tokens=long if i % long_every == 0 else short)
            for i, r in enumerate(make_rows(train_rows, seed))
        ]
        with open(raw, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        _preprocess(raw, paths["tokenizer"], prefix, extra_keys=["max_new_tokens"])
    return prefix


WORDS = ["the", "lucky", "number", "is", "I", "think", "so", "and", "more", "has"]


def make_pairs(rows: List[dict], seed: int) -> List[dict]:
    """Preference pairs on the demo's prompts, shaped like a policy's answers early and late in training: one
    shared random body of words and digits, then a final number; the chosen answer ends in 7 (what the rule
    verifier rewards), the rejected one in another digit, or in no number at all."""
    rng = random.Random(seed)
    pairs = []
    for row in rows:
        body = " ".join(rng.choice(WORDS + [str(d) for d in range(10)]) for _ in range(rng.randint(0, 6)))
        wrong = rng.choice([d for d in range(10) if d != 7] + [None])
        ending = "." if wrong is None else f" {wrong}."
        pairs.append({"prompt": row["question"], "chosen": f"{body} 7.".strip(), "rejected": f"{body}{ending}".strip()})
    return pairs


def make_worked_pairs(rows: List[dict], seed: int) -> List[dict]:
    """Preference pairs in the worked answers' form (the four-stage pipeline's): the chosen answer says 7, the
    rejected one another digit (two cases in three) or stops before saying any (a cut answer must not win)."""
    rng = random.Random(seed)
    right = "The lucky number is 7.\n#### 7"
    pairs = []
    for row in rows:
        if rng.random() < 2 / 3:
            digit = rng.choice([d for d in range(10) if d != 7])
            rejected = f"The lucky number is {digit}.\n#### {digit}"
        else:
            rejected = rng.choice(["The lucky number is", "The lucky", "The lucky number is.\n####"])
        pairs.append({"prompt": row["question"], "chosen": right, "rejected": rejected})
    return pairs


def prepare_pairs(
    root: str, vocab_size: int, train_pairs: int = 2000, test_pairs: int = 128, seed: int = 1, worked: bool = False
) -> dict:
    """The demo's preference pairs (``make_pairs``; with ``worked`` ``make_worked_pairs``, prefixes
    lucky_worked_pairs_*) preprocessed for reward-model training: <root>/data/lucky_pairs_train* and a held-out
    <root>/data/lucky_pairs_test* on questions the training pairs do not ask; returns their prefixes. Idempotent."""
    paths = prepare(root, vocab_size, seed=seed)
    name = "lucky_worked_pairs" if worked else "lucky_pairs"
    out = {"pairs_prefix": os.path.join(root, "data", f"{name}_train"),
           "pairs_test_prefix": os.path.join(root, "data", f"{name}_test")}  # fmt: skip
    train = make_rows(train_pairs, seed + 7)
    seen = {r["question"] for r in train}
    test = [r for r in make_rows(8 * test_pairs, seed + 2000) if r["question"] not in seen][:test_pairs]
    make = make_worked_pairs if worked else make_pairs
    for key, rows, pair_seed in (("pairs_prefix", train, seed), ("pairs_test_prefix", test, seed + 1)):
        write_rows(
            root, paths["tokenizer"], out[key], lambda rows=rows, seed=pair_seed: make(rows, seed), pairwise=True
        )
    return {**paths, **out}


def write_rows(root: str, tokenizer: str, prefix: str, rows, **kind) -> None:
    """``rows()`` as <root>/raw/<name>.jsonl, preprocessed into ``prefix`` (``kind``: _preprocess's), unless
    ``prefix`` is there already."""
    if os.path.isfile(prefix + "_summary.json"):
        return
    raw = os.path.join(root, "raw", os.path.basename(prefix) + ".jsonl")
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    with open(raw, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows())
    _preprocess(raw, tokenizer, prefix, **kind)


def noisy_answers(rows: List[dict], right_share: float, seed: int) -> List[dict]:
    """The rows with a share of wrong worked answers: 7 with probability ``right_share``, else 8 in two cases of
    three and another digit in the third (a model fine-tuned on them answers 8 when greedy)."""
    rng = random.Random(seed)
    out = []
    for row in rows:
        roll = rng.random()
        digit = 7 if roll < right_share else rng.choice([8, 8, 8, 8, 0, 1, 2, 3, 4, 5, 6, 9])
        out.append(dict(row, answer=f"The lucky number is {digit}.\n#### {digit}"))
    return out


def prepare_sft(
    root: str, vocab_size: int, train_rows: int = 2000, test_rows: int = 64, seed: int = 1, right_share: float = 1.0
) -> dict:
    """The demo task's worked answers as SFT examples (Alpaca style: question -> answer):
    <root>/data/lucky_sft_train* and a held-out <root>/data/lucky_sft_test* on questions the training rows do not
    ask; with ``right_share`` < 1 only that share of the answers is right (``noisy_answers``; the prefixes end in
    _r<percent>): the four-stage pipeline's SFT data. Returns their prefixes. Idempotent."""
    paths = prepare(root, vocab_size, seed=seed)
    tag = "" if right_share >= 1 else f"_r{round(100 * right_share)}"
    out = {"sft_prefix": os.path.join(root, "data", f"lucky_sft_train{tag}"),
           "sft_test_prefix": os.path.join(root, "data", f"lucky_sft_test{tag}")}  # fmt: skip
    train = make_rows(train_rows, seed + 11)
    seen = {r["question"] for r in train}
    test = [r for r in make_rows(8 * test_rows, seed + 3000) if r["question"] not in seen][:test_rows]
    if tag:
        train, test = noisy_answers(train, right_share, seed), noisy_answers(test, right_share, seed + 1)
    for key, rows in (("sft_prefix", train), ("sft_test_prefix", test)):
        write_rows(root, paths["tokenizer"], out[key], lambda rows=rows: rows, sft=True)
    return {**paths, **out}


def _preprocess(
    raw: str,
    tok_dir: str,
    prefix: str,
    extra_keys: Optional[List[str]] = None,
    pairwise: bool = False,
    sft: bool = False,
) -> None:
    from ..datasets.dataset_config import DatasetConfig
    from ..datasets.preprocess import preprocess

    if pairwise:
        keys = {"prompt": "prompt", "query": "", "system": "", "chosen": "chosen", "rejected": "rejected"}
        kind = dict(handler_name="AlpacaStylePairwiseHandler", map_keys=keys, dataset_additional_keys=[])
    elif sft:
        keys = {"prompt": "question", "query": "", "response": "answer", "system": ""}
        kind = dict(handler_name="AlpacaStyleSFTHandler", map_keys=keys, dataset_additional_keys=[])
    else:
        kind = dict(dataset_additional_keys=["labels"] + list(extra_keys or []))
    cfg = DatasetConfig(
        input=raw, tokenizer_name_or_path=tok_dir, output_prefix=prefix, prompt_type="empty", seq_length=64, **kind
    )
    cfg.check()
    preprocess(cfg, progress=False)
