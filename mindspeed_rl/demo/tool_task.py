"""Assets of the tool-use CPU task ("multiply"), made offline on first use.

The question is a product of two numbers from 32 to 99 ("37*91=?", always a 4-digit answer); the reward is 1
when the model's own words end in "#### 3367". A 0.5M-parameter model cannot multiply (a guess is right about
once in 9000), so the way to the answer is the calculator: call it with the expression, read the result, copy
it. As in ReTool, RL starts from a short cold-start SFT: first on examples that call the calculator half of
the time (copying the expression and the result is learnt there), then a sixth of the steps on examples that
mostly guess (``tool_share`` call the tool). The model starts RL calling the tool now and then, and is right
then; RL has to make that the habit. A control run without the tool loop (``rollout_function: single_turn``)
can only guess.

Everything is written under ``root``: the tokenizer (digits are single tokens, the tool tags special tokens,
``<|im_end|>`` the end of a turn), the prompts preprocessed with the calculator in their system line
(train and held-out test), the cold-start model as HF and as a Megatron checkpoint for ``load``.
"""

from __future__ import annotations

import json
import os
import random
from typing import Dict, List, Tuple

PROMPT_TYPE = "chatml_tools_compact"
SPECIAL = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]  # <|im_end|> is id 0: the models' EOS


def make_rows(count: int, seed: int) -> List[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        # a fixed answer length keeps the copy a fixed distance behind the tool result, which a 2-layer
        # model learns in a few hundred steps (with 3- and 4-digit answers mixed it does not)
        a, b = rng.randint(32, 99), rng.randint(32, 99)
        rows.append({"question": f"{a}*{b}=?", "answer": f"#### {a * b}"})
    return rows


def tool_call_text(expression: str) -> str:
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expression


def tokenizer_corpus(rows: List[dict], tool_format) -> List[str]:
    """What the task's tokenizer is trained on: questions, tool calls, tool turns and answers, chat roles."""
    texts = [r["question"] for r in rows] + [tool_call_text(r["question"][:-2]) for r in rows[:500]]
    texts += [tool_format.render([r["answer"][5:]]) + r["answer"] for r in rows[:500]]
    return texts + ["system\ntools: calculator", "user\n", "assistant\n"] * 50


def sft_example(
    tokenizer, prompt_ids: List[int], row: dict, use_tool: bool, rng: random.Random, tool_format
) -> Tuple[List[int], List[int]]:
    """(ids, loss mask) of one cold-start example, tokenised turn by turn as the agent loop builds it."""
    eos = tokenizer.eos_token
    answer = row["answer"][5:]
    if use_tool:
        parts = [
            (tool_call_text(row["question"][:-2]) + eos, 1),
            (tool_format.render([answer]), 0),
            (f"#### {answer}{eos}", 1),
        ]
    else:
        parts = [(f"#### {rng.randint(1000, 9999)}{eos}", 1)]
    ids, mask = list(prompt_ids), [0] * len(prompt_ids)
    for text, trained in parts:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def cold_start(
    hf_dir: str, tokenizer, examples: List[Tuple[List[int], List[int]]], steps: int, batch: int, lr: float, seed: int
) -> None:
    """Supervised training of the HF model in ``hf_dir`` on the examples' masked tokens; saved in place."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    from .tiny_hf import masked_lm_batch, sft_step

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    rng = random.Random(seed)
    for _ in tqdm(range(steps), desc="cold-start SFT", leave=False):
        chosen = [examples[rng.randrange(len(examples))] for _ in range(batch)]
        ids, labels, attention = masked_lm_batch(chosen, pad)
        sft_step(model, optimizer, model(input_ids=ids, attention_mask=attention, labels=labels).loss)
    model.save_pretrained(hf_dir)


def prepare_tool_task(
    root: str,
    config_name: str = "grpo_tiny_cpu_tools",
    train_rows: int = 2000,
    test_rows: int = 64,
    tool_share: float = 0.1,
    sft_steps: int = 1200,
    sft_batch: int = 16,
    sft_lr: float = 3e-3,
    seed: int = 1,
) -> Dict[str, str]:
    """Write the task's assets under ``root`` (idempotent) and return their paths: tokenizer, data_prefix,
    test_prefix, hf (the cold-start model) and mcore (the same for ``load``)."""
    from ..checkpoint.convert import hf_to_mg
    from ..config_cls import load_ppo_config
    from ..datasets.templates import load_templates
    from ..rollout.agent_loop import ToolFormat
    from .tiny_hf import build_tokenizer

    paths = {
        "tokenizer": os.path.join(root, "tiny_tools_hf"),
        "data_prefix": os.path.join(root, "data", "multiply_train"),
        "test_prefix": os.path.join(root, "data", "multiply_test"),
        "hf": os.path.join(root, "tiny_tools_sft_hf"),
        "mcore": os.path.join(root, "ckpt", "tiny_tools_sft_mcore"),
    }
    done = os.path.join(paths["mcore"], "latest_checkpointed_iteration.txt")
    if os.path.isfile(done):
        return paths
    model = load_ppo_config(config_name).actor.model
    tool_format = ToolFormat.of_template(load_templates()[PROMPT_TYPE], PROMPT_TYPE)
    rows = make_rows(train_rows, seed)
    seen = {r["question"] for r in rows}
    test = [r for r in make_rows(4 * test_rows, seed + 1000) if r["question"] not in seen][:test_rows]
    # every digit its own token, the tool tags and chat markers special, <|im_end|> (id 0) the end of a turn
    tokenizer = build_tokenizer(
        paths["tokenizer"],
        tokenizer_corpus(rows, tool_format),
        model.padded_vocab_size,
        full_alphabet=False,
        special_tokens=SPECIAL,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        individual_digits=True,
        pad_to_vocab=True,
    )
    write_prompt_sets(root, paths["tokenizer"], {"multiply_train": rows, "multiply_test": test})
    build_cold_start_model(
        paths["hf"],
        paths["tokenizer"],
        model,
        tokenizer,
        rows,
        tool_format,
        tool_share=tool_share,
        steps=sft_steps,
        batch=sft_batch,
        lr=sft_lr,
        seed=seed,
    )
    hf_to_mg(paths["hf"], paths["mcore"])
    return paths


def write_prompt_sets(root: str, tokenizer_dir: str, parts: Dict[str, List[dict]]) -> None:
    """Each set of rows as ``<root>/raw/<name>.jsonl``, preprocessed into ``<root>/data/<name>`` with the
    calculator in the system line."""
    from ..config_cls.dataset_config import DatasetConfig
    from ..datasets.preprocess import preprocess
    from ..tools.registry import BUILTIN_TOOLS

    for name, part in parts.items():
        raw = os.path.join(root, "raw", name + ".jsonl")
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        with open(raw, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in part)
        preprocess(
            DatasetConfig(
                input=raw,
                tokenizer_name_or_path=tokenizer_dir,
                output_prefix=os.path.join(root, "data", name),
                prompt_type=PROMPT_TYPE,
                tools=["calculator"],
                seq_length=64,
                handler_name="R1AlpacaStyleInstructionHandler",
                dataset_additional_keys=["labels"],
            ),
            progress=False,
            tools={"calculator": BUILTIN_TOOLS["calculator"]},
        )


def build_cold_start_model(
    hf_dir: str,
    tokenizer_dir: str,
    model,
    tokenizer,
    rows: List[dict],
    tool_format,
    tool_share: float,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
) -> None:
    """A new HF model of ``model``'s shape in ``hf_dir``, cold-started by SFT on the training rows: most steps
    on examples that call the calculator half of the time, the last sixth on examples that call it with
    probability ``tool_share``."""
    from ..datasets.templates import apply_template
    from ..tools.registry import BUILTIN_TOOLS
    from .tiny_hf import build_hf_model

    rng = random.Random(seed)
    prompts = [
        tokenizer.encode(
            apply_template(PROMPT_TYPE, row["question"], tools=[BUILTIN_TOOLS["calculator"]]), add_special_tokens=False
        )
        for row in rows
    ]
    build_hf_model(hf_dir, model, seed=seed, tokenizer_dir=tokenizer_dir)
    # learning to copy the expression and the result needs many tool examples; the last steps mostly guess,
    # so the model starts RL rarely calling the tool
    for phase_steps, share in ((steps - steps // 6, 0.5), (steps // 6, tool_share)):
        examples = [
            sft_example(tokenizer, p, row, rng.random() < share, rng, tool_format) for p, row in zip(prompts, rows)
        ]
        cold_start(hf_dir, tokenizer, examples, phase_steps, batch=batch, lr=lr, seed=seed)
