"""The demo's generative judge: a tiny causal LM fine-tuned here to grade the lucky-number task, so that a GRPO run
rewarded by a judge alone (grpo_tiny_cpu_judge) can be shown on this CPU.

Its examples are the judge's prompt (``TEMPLATE``: the question, a response shaped like a policy's samples, the
label) followed by its answer "Score 1" or "Score 0" (judge_config score_max 1), as the rule verifier would grade
the response; the tokenizer is the demo's (it has no ':'; hence ``SCORE_PATTERN``). The SFT stage trains it
(``configs/sft_tiny_cpu_judge.yaml``).
"""

from __future__ import annotations

import os
import random
from typing import List

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


def judge_rows(tokenizer, rows: List[dict], rng: random.Random) -> List[dict]:
    """The judge's fine-tuning examples as SFT rows: the judge's prompt (``question``, in no chat template) and its
    answer (``answer``, the trained tokens with EOS)."""
    from ..rewards.judge import render

    out = []
    for row in rows:
        response = sample_response(tokenizer, rng)
        out.append(
            {"question": render(TEMPLATE, row["question"], response, "7"), "answer": judge_answer(response, "7")}
        )
    return out


def agreement(judge_dir: str, examples: List[dict]) -> float:
    """The share of ``examples`` (judge_rows) whose greedy reply the judge model in ``judge_dir`` (HF) gives the
    same grade as the rule verifier."""
    import re

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(judge_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(judge_dir, dtype=torch.float32).eval()
    batch = tokenizer([e["question"] for e in examples], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    replies = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    grades = [re.search(SCORE_PATTERN, r, re.IGNORECASE) for r in replies]
    return sum(g is not None and f"Score {g.group(1)}" == e["answer"] for g, e in zip(grades, examples)) / len(examples)


def served_tokenizer(tokenizer_dir: str, out: str, model) -> str:
    """``out``: the tokenizer files of ``tokenizer_dir`` beside the model's config.json, so that transformers loads
    them as it will in the judge's HF folder (served by vLLM): for a Qwen2 model it builds Qwen2's tokenizer, whose
    pre-tokenizer splits digits, whatever tokenizer.json says. The judge's examples are tokenised as it will read
    its prompts."""
    import shutil

    from .tiny_hf import hf_config_for

    if not os.path.isfile(os.path.join(out, "config.json")):
        shutil.copytree(tokenizer_dir, out, dirs_exist_ok=True)
        hf_config_for(model).save_pretrained(out)
    return out


def prepare_judge(root: str, model, steps: int = 900, batch: int = 32, lr: float = 3e-3, seed: int = 1) -> str:
    """<root>/tiny_judge_hf: a new model of ``model``'s shape fine-tuned by the SFT stage (``sft_tiny_cpu_judge``)
    on ``judge_rows``, as a HF folder; returns it and prints its agreement with the verifier on 200 held-out
    examples. Idempotent."""
    from transformers import AutoTokenizer

    from ..checkpoint.convert import hf_folder_of
    from .assets import write_rows
    from .fine_tune import fine_tune

    paths = prepare(root, model.padded_vocab_size, seed=seed)
    out = os.path.join(root, "tiny_judge_hf")
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    tokenizer_dir = served_tokenizer(paths["tokenizer"], os.path.join(root, "tiny_judge_tokenizer"), model)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(seed + 11)
    prefix, save = os.path.join(root, "data", "judge_sft"), os.path.join(root, "ckpt", "judge_sft")
    write_rows(root, tokenizer_dir, prefix, lambda: judge_rows(tokenizer, make_rows(4000, seed + 11), rng), sft=True)
    fine_tune(
        "sft_tiny_cpu_judge",
        {
            "megatron_training.tokenizer_name_or_path": tokenizer_dir,
            "megatron_training.data_path": prefix,
            "megatron_training.train_iters": steps,
            "megatron_training.save_interval": steps,
            "megatron_training.global_batch_size": batch,
            "megatron_training.seed": seed + 11,
            "actor_config.lr": lr,
            "actor_config.save": save,
            "rl_config.log_dir": os.path.join(root, "logs_judge_sft"),
        },
    )
    os.replace(hf_folder_of(save, steps), out)
    held_out = judge_rows(tokenizer, make_rows(200, seed + 5000), random.Random(seed + 5000))
    print(f"judge model: agrees with the rule verifier on {agreement(out, held_out):.0%} of 200 held-out examples")
    return out
