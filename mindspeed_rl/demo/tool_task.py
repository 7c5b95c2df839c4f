"""Assets of the tool-use CPU task ("multiply"), made offline on first use.

The question is a product of two numbers from 32 to 99 ("37*91=?", always a 4-digit answer); the reward is 1
when the model's own words end in "#### 3367". A 0.5M-parameter model cannot multiply (a guess is right about
once in 9000), so the way to the answer is the calculator: call it with the expression, read the result, copy
it. As in ReTool, RL starts from a short cold-start SFT, run by the SFT stage (cli/train_sft.py, config
``sft_tiny_cpu_tools``) on a randomly initialised model: its rows are tool conversations in the order they are
trained (``no_shuffle``), first examples that call the calculator half of the time (copying the expression and
the result is learnt there), then a sixth of the steps on examples that mostly guess (``tool_share`` call the
tool), while the learning rate decays (cosine) so that the model ends at that phase's average rather than at
its last few batches. The model starts RL calling the tool now and then, and is right then; RL has to make that
the habit. A control run without the tool loop (``rollout_function: single_turn``) can only guess.

Everything is written under ``root``: the tokenizer (digits are single tokens, the tool tags special tokens,
``<|im_end|>`` the end of a turn), the prompts preprocessed with the calculator in their system line (train and
held-out test), the cold-start conversations, and the cold-start model as a Megatron checkpoint for ``load`` with
its HF copy beside it.
"""

from __future__ import annotations

import json
import os
import random
from typing import Dict, List

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


def cold_start_conversation(row: dict, use_tool: bool, rng: random.Random) -> List[dict]:
    """One cold-start example as chat messages: the question, then the tool call, its result and the copied
    answer, or a guessed answer."""
    if not use_tool:
        return [
            {"role": "user", "content": row["question"]},
            {"role": "assistant", "content": f"#### {rng.randint(1000, 9999)}"},
        ]
    return [
        {"role": "user", "content": row["question"]},
        {"role": "assistant", "content": tool_call_text(row["question"][:-2])},
        {"role": "tool", "content": row["answer"][5:]},
        {"role": "assistant", "content": row["answer"]},
    ]


def cold_start_rows(rows: List[dict], steps: int, batch: int, tool_share: float, seed: int) -> List[dict]:
    """``steps`` x ``batch`` conversations in training order: the rows shuffled epoch after epoch, those of the
    first five sixths of the steps calling the tool half of the time, the rest with probability ``tool_share``."""
    rng = random.Random(seed)
    out: List[dict] = []
    order: List[dict] = []
    for phase_steps, share in ((steps - steps // 6, 0.5), (steps // 6, tool_share)):
        for _ in range(phase_steps * batch):
            if not order:
                order = rng.sample(rows, len(rows))
            out.append({"messages": cold_start_conversation(order.pop(), rng.random() < share, rng)})
    return out


def prepare_tool_task(
    root: str,
    config_name: str = "grpo_tiny_cpu_tools",
    train_rows: int = 2000,
    test_rows: int = 64,
    tool_share: float = 0.15,
    sft_steps: int = 1200,
    sft_batch: int = 16,
    sft_lr: float = 3e-3,
    seed: int = 1,
) -> Dict[str, str]:
    """Write the task's assets under ``root`` (idempotent) and return their paths: tokenizer, data_prefix,
    test_prefix, mcore (the cold-start model for ``load``) and hf (its HF copy)."""
    from ..datasets.templates import ToolFormat, load_templates
    from ..features import load_ppo_config
    from .fine_tune import fine_tune
    from .tiny_hf import build_tokenizer

    paths = {
        "tokenizer": os.path.join(root, "tiny_tools_hf"),
        "data_prefix": os.path.join(root, "data", "multiply_train"),
        "test_prefix": os.path.join(root, "data", "multiply_test"),
        "mcore": os.path.join(root, "ckpt", "tiny_tools_sft_mcore"),
    }
    paths["hf"] = os.path.join(paths["mcore"], f"iter_{sft_steps:07d}_hf")
    done = os.path.join(paths["mcore"], "latest_checkpointed_iteration.txt")
    if os.path.isfile(done):
        return paths
    model = load_ppo_config(config_name).actor.model
    tool_format = ToolFormat.of_template(load_templates()[PROMPT_TYPE], PROMPT_TYPE)
    rows = make_rows(train_rows, seed)
    seen = {r["question"] for r in rows}
    test = [r for r in make_rows(4 * test_rows, seed + 1000) if r["question"] not in seen][:test_rows]
    # every digit its own token, the tool tags and chat markers special, <|im_end|> (id 0) the end of a turn
    build_tokenizer(
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
    preprocess_rows(root, paths["tokenizer"], {"multiply_train": rows, "multiply_test": test})
    sft_rows = cold_start_rows(rows, sft_steps, sft_batch, tool_share, seed)
    preprocess_rows(root, paths["tokenizer"], {"multiply_sft": sft_rows}, sft=True)
    fine_tune(
        "sft_tiny_cpu_tools",
        {
            "megatron_training.tokenizer_name_or_path": paths["tokenizer"],
            "megatron_training.data_path": os.path.join(root, "data", "multiply_sft"),
            "megatron_training.train_iters": sft_steps,
            "megatron_training.save_interval": sft_steps,
            "megatron_training.global_batch_size": sft_batch,
            "megatron_training.seed": seed,
            "actor_config.lr": sft_lr,
            "actor_config.save": paths["mcore"],
            "rl_config.log_dir": os.path.join(root, "logs_tools_sft"),
        },
    )
    return paths


def preprocess_rows(root: str, tokenizer_dir: str, parts: Dict[str, List[dict]], sft: bool = False) -> None:
    """Each set of rows as ``<root>/raw/<name>.jsonl``, preprocessed into ``<root>/data/<name>`` with the
    calculator in the system line: prompts with their labels, or (``sft``) conversations for the SFT stage."""
    from ..datasets.dataset_config import DatasetConfig
    from ..datasets.preprocess import preprocess
    from ..tools.registry import BUILTIN_TOOLS

    if sft:
        keys = {"messages": "messages"}
        kind = dict(handler_name="MessagesStyleSFTHandler", map_keys=keys, dataset_additional_keys=[], seq_length=128)
    else:
        kind = dict(handler_name="R1AlpacaStyleInstructionHandler", dataset_additional_keys=["labels"], seq_length=64)
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
                **kind,
            ),
            progress=False,
            tools={"calculator": BUILTIN_TOOLS["calculator"]},
        )
