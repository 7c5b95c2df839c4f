"""Supervised fine-tuning (cli/train_sft.py) on the demo task's worked answers (``demo.assets.prepare_sft``): the
conversation layout and its loss mask, the handlers' skips, the loss against its formula, the config's refusals,
and one end-to-end run that trains, validates, saves (with its HF copy), continues into DPO (resumed exactly there)
and leaves the actor a PPO run loads."""

import json
import math
import os

import pytest
import torch

from mindspeed_rl.algorithms.supervised import perplexity, sft_loss, sft_nll_sum
from mindspeed_rl.datasets.conversations import BadConversation, conversation_tokens, normalised_messages, sft_rows
from tests.helpers import checkpoints_up_to


class Chars:
    """One token per character (ids 10+), EOS 1: a tokenizer whose pieces are easy to read back."""

    eos_token_id = 1

    def encode(self, text, add_special_tokens=False):
        return [10 + ord(c) for c in text]

    def decode(self, ids):
        return "".join("|" if i == 1 else chr(i - 10) for i in ids)


def trained(ids, mask):
    return Chars().decode([i for i, m in zip(ids, mask) if m])


def test_a_multi_turn_conversation_trains_every_assistant_turn_in_the_chat_template():
    messages = [("system", "S"), ("user", "hi"), ("assistant", "yo"), ("user", "q"), ("assistant", "a")]
    ids, mask = conversation_tokens(messages, Chars(), "qwen")
    text = Chars().decode(ids)
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo|"
        "\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na|"
    )
    assert trained(ids, mask) == "yo|a|"  # each answer and its EOS; the prompts and the separator are context
    default_system = Chars().decode(conversation_tokens(messages[1:3], Chars(), "qwen")[0])
    assert default_system.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    sharegpt = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]
    assert normalised_messages(sharegpt) == [("user", "hi"), ("assistant", "yo")]


@pytest.mark.parametrize(
    "messages,reason",
    [
        ([("user", "hi")], "no_assistant_turn"),
        ([("assistant", "a"), ("user", "hi")], "turns_out_of_order"),
        ([("user", "a"), ("user", "b"), ("assistant", "c")], "turns_out_of_order"),
        ([("user", "hi"), ("assistant", "  ")], "empty_response"),
        ([("user", "hi"), ("assistant", "x" * 80)], "too_long"),
    ],
)
def test_a_conversation_that_cannot_train_says_why(messages, reason):
    with pytest.raises(BadConversation) as info:
        conversation_tokens(messages, Chars(), "empty", max_length=64)
    assert info.value.reason == reason
    with pytest.raises(BadConversation, match="unknown_role:bot"):
        normalised_messages([{"role": "bot", "content": "x"}])


def test_tool_turns_are_rendered_as_the_agent_loop_appends_tool_results_and_never_trained():
    from mindspeed_rl.datasets.templates import ToolFormat, apply_template, load_templates
    from mindspeed_rl.tools.registry import BUILTIN_TOOLS

    calculator = BUILTIN_TOOLS["calculator"]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    messages = normalised_messages(
        [
            {"role": "user", "content": "2*3=?"},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": "6"},
            {"from": "observation", "value": "ok"},
            {"role": "assistant", "content": "#### 6"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "#### 6"},
        ]
    )
    ids, mask = conversation_tokens(messages, Chars(), "chatml_tools_compact", tools=[calculator])
    tool_turn = ToolFormat.of_template(load_templates()["chatml_tools_compact"], "x").render(["6", "ok"])
    separator = load_templates()["chatml_tools_compact"]["turn_separator"]
    expected = (
        apply_template("chatml_tools_compact", "2*3=?", system="", tools=[calculator])
        + call
        + "|"
        + tool_turn
        + "#### 6|"
        + separator
        + apply_template("chatml_tools_compact", "again", system="")
        + "#### 6|"
    )
    assert Chars().decode(ids) == expected and "tools: calculator" in expected
    assert trained(ids, mask) == call + "|#### 6|#### 6|"  # the tool results are context only
    for bad, reason in (
        ([("user", "q"), ("tool", "6"), ("assistant", "a")], "turns_out_of_order"),
        ([("user", "q"), ("assistant", "a"), ("tool", "6")], "turns_out_of_order"),
    ):
        with pytest.raises(BadConversation, match=reason):
            conversation_tokens(bad, Chars(), "chatml_tools_compact")
    with pytest.raises(BadConversation, match="no_tool_role"):
        conversation_tokens(messages, Chars(), "empty")


def test_bad_rows_are_skipped_and_counted_by_both_handlers(demo_assets, tmp_path):
    from mindspeed_rl.datasets.dataset_config import DatasetConfig
    from mindspeed_rl.datasets.preprocess import preprocess
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset

    rows = {
        "AlpacaStyleSFTHandler": [
            {"q": "What is the lucky number?", "a": "7", "h": [["Say 7.", "7"]]},
            {"q": "Which number?", "a": ""},
            {"q": "Which number?"},
            {"q": "Tell me.", "a": "7", "h": "not pairs"},
            {"q": "Give the lucky number.", "a": " ".join(["7"] * 80)},
        ],
        "MessagesStyleSFTHandler": [
            {"m": [{"role": "user", "content": "Say the lucky number."}, {"role": "assistant", "content": "7"}]},
            {"m": [{"role": "user", "content": "Say it."}]},
            {"m": [{"role": "robot", "content": "7"}]},
        ],
    }
    keys = {"AlpacaStyleSFTHandler": {"prompt": "q", "response": "a", "history": "h"}, "MessagesStyleSFTHandler":
            {"messages": "m"}}  # fmt: skip
    summaries = {}
    for handler, part in rows.items():
        raw = tmp_path / f"{handler}.jsonl"
        raw.write_text("".join(json.dumps(r) + "\n" for r in part))
        cfg = DatasetConfig(input=str(raw), tokenizer_name_or_path=demo_assets["tokenizer"], handler_name=handler,
                            output_prefix=str(tmp_path / handler), prompt_type="empty", seq_length=64,
                            map_keys=keys[handler], dataset_additional_keys=[])  # fmt: skip
        cfg.check()
        summaries[handler] = preprocess(cfg, progress=False)
        kept = PromptDataset(str(tmp_path / handler), (), token_fields=("loss_mask",))
        item = kept[0]
        assert len(kept) == 1 and len(item["input_ids"]) == len(item["loss_mask"]) and 0 < sum(item["loss_mask"])
    assert summaries["AlpacaStyleSFTHandler"]["skipped"] == {
        "empty_response": 1, "missing_key:a": 1, "history_not_a_list_of_pairs": 1, "too_long": 1}  # fmt: skip
    assert summaries["MessagesStyleSFTHandler"]["skipped"] == {"no_assistant_turn": 1, "unknown_role:robot": 1}


def test_the_loss_is_the_steps_token_mean_whatever_the_split():
    torch.manual_seed(0)
    log_probs, mask = -torch.rand(4, 6), (torch.rand(4, 6) > 0.4).long()
    mask[:, 0] = 0
    by_hand = -sum(float(log_probs[b, t]) for b in range(4) for t in range(6) if mask[b, t]) / int(mask.sum())
    whole = sft_loss(log_probs, mask, int(mask.sum()))
    halves = sum(sft_loss(log_probs[k : k + 2], mask[k : k + 2], int(mask.sum())) for k in (0, 2))
    assert float(whole) == pytest.approx(by_hand) and float(halves) == pytest.approx(by_hand)
    assert perplexity(float(sft_nll_sum(log_probs, mask)), int(mask.sum())) == pytest.approx(math.exp(by_hand))
    rows = sft_rows([{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [0]}])
    assert rows["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]] and rows["attention_mask"].sum(1).tolist() == [3, 1]
    assert rows["loss_mask"].tolist() == [[0, 1, 1], [0, 0, 0]]


@pytest.mark.parametrize(
    "override,key",
    [
        ("actor_config.micro_batch_size=5", "actor_config.micro_batch_size"),
        ("rl_config.n_samples_per_prompt=4", "rl_config.n_samples_per_prompt"),
        ("megatron_training.stage=rm", "megatron_training.stage"),
        ("+critic_config.lr=1e-3", "critic_config"),
        ("megatron_training.test_data_path=null", "megatron_training.test_data_path"),
    ],
)
def test_a_bad_sft_config_exits_2_naming_the_key(override, key, capsys):
    from cli.train_sft import main

    assert main(["--config-name", "sft_tiny_cpu", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0] and "Traceback" not in err[0], err


def stage_config(stage, config, root, data, tokenizer, iterations, **extra):
    from mindspeed_rl.features import load_stage_config

    overrides = {
        "megatron_training.tokenizer_name_or_path": tokenizer,
        "megatron_training.train_iters": iterations,
        "megatron_training.save_interval": 2,
        "rl_config.test_freq": 2,
        "rl_config.log_dir": f"{root}/logs",
        "actor_config.save": f"{root}/ckpt",
        **data,
        **extra,
    }
    return load_stage_config(stage, config, [f"{k}={v}" for k, v in overrides.items()])


def resumed_from(tmp_path, run, at, stage, config, data, tokenizer, iterations):
    """The run of ``config`` resumed (finetune false) from iteration ``at`` of ``run``'s checkpoints."""
    from mindspeed_rl.trainer.stages.stage_launch import train

    folder = tmp_path / f"{run}_resumed_ckpt"
    checkpoints_up_to(str(tmp_path / run / "ckpt"), str(folder), at)
    return train(stage_config(stage, config, tmp_path / f"{run}_resumed", data, tokenizer, iterations, **{
        "actor_config.finetune": False, "actor_config.load": folder, "actor_config.save": folder,
        "actor_config.no_load_optim": False, "actor_config.no_load_rng": False}))  # fmt: skip


@pytest.mark.slow
def test_sft_then_dpo_learn_resume_exactly_and_ppo_loads_the_actor(demo_assets, tmp_path):
    """SFT 4 steps from a random init; DPO 3 steps from the SFT save (policy = reference at the start), resumed
    from step 2 to the same step 3 (the reference is the SFT model again: the stage loop's exact resume, which SFT
    shares, with DPO's reference on top); a PPO run's actor loads the SFT save."""
    from transformers import AutoModelForCausalLM

    from mindspeed_rl.demo.assets import prepare_pairs, prepare_sft
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.stages.stage_launch import train
    from mindspeed_rl.trainer.startup.preflight import check_role, resume_iteration

    root, tokenizer = os.path.dirname(demo_assets["tokenizer"]), demo_assets["tokenizer"]
    made = prepare_sft(root, 256)
    sft_data = {"megatron_training.data_path": made["sft_prefix"],
                "megatron_training.test_data_path": made["sft_test_prefix"]}  # fmt: skip
    whole = train(stage_config("sft", "sft_tiny_cpu", tmp_path / "sft", sft_data, tokenizer, 4))
    assert [m["iteration"] for m in whole] == [1, 2, 3, 4]
    loss, val = [m["sft/loss"] for m in whole], [m["val/sft/loss"] for m in whole if "val/sft/loss" in m]
    assert abs(loss[0] - math.log(256)) < 0.5 and loss[-1] < 0.7 * loss[0], loss  # from ~uniform over 256 tokens
    assert len(val) == 2 and val[-1] < 0.7 * loss[0], val
    hf = tmp_path / "sft" / "ckpt" / "iter_0000004_hf"
    assert AutoModelForCausalLM.from_pretrained(hf).config.architectures[0].endswith("ForCausalLM")

    pairs = prepare_pairs(root, 256)
    dpo_data = {"megatron_training.data_path": pairs["pairs_prefix"],
                "megatron_training.test_data_path": pairs["pairs_test_prefix"],
                "actor_config.load": tmp_path / "sft" / "ckpt"}  # fmt: skip
    dpo = train(stage_config("dpo", "dpo_tiny_cpu", tmp_path / "dpo", dpo_data, tokenizer, 3))
    assert dpo[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-5)  # the first step: the policy is its reference
    assert dpo[-1]["dpo/loss"] < dpo[0]["dpo/loss"] and dpo[-1]["rewards/margins"] > 0, dpo
    again = resumed_from(tmp_path, "dpo", 2, "dpo", "dpo_tiny_cpu", dpo_data, tokenizer, 3)
    assert [m["iteration"] for m in again] == [3]
    for key in ("dpo/loss", "rewards/margins", "logps/chosen", "val/rewards/accuracies"):
        assert [m.get(key) for m in again] == [m.get(key) for m in dpo[2:]], key

    # the next stage: a PPO run starts its actor from the SFT checkpoint (finetune: weights only)
    ppo = load_ppo_config("ppo_tiny_cpu", [f"actor_config.load={tmp_path / 'sft' / 'ckpt'}"])
    assert resume_iteration(ppo) is None
    check_role(ppo.actor, None, trains=True)


def test_the_demo_fine_tunes_are_sft_rows_the_handlers_take():
    """The tool task's cold start (tool conversations, curriculum order) and the judge's grading examples are rows of
    the SFT stage's handlers."""
    import random

    from mindspeed_rl.demo.judge_task import judge_rows
    from mindspeed_rl.demo.tool_task import cold_start_rows, make_rows
    from mindspeed_rl.tools.registry import BUILTIN_TOOLS

    rows = cold_start_rows(make_rows(10, 1), steps=60, batch=4, tool_share=0.0, seed=1)
    calls = [len(r["messages"]) == 4 for r in rows]
    assert len(rows) == 240 and 0.3 < sum(calls[:200]) / 200 < 0.7 and not any(calls[200:])  # the last sixth guesses
    for row in rows[:20]:
        ids, mask = conversation_tokens(
            normalised_messages(row["messages"]), Chars(), "chatml_tools_compact", tools=[BUILTIN_TOOLS["calculator"]]
        )
        assert trained(ids, mask).endswith(row["messages"][-1]["content"] + "|")

    class Vocab(Chars):
        def __len__(self):
            return 200

        def decode(self, ids, skip_special_tokens=False):
            return super().decode([i for i in ids if i >= 10])

    judged = judge_rows(Vocab(), make_rows(20, 2), random.Random(3))
    assert {r["answer"] for r in judged} <= {"Score 0", "Score 1"}
    ids, mask = conversation_tokens(
        [("user", judged[0]["question"]), ("assistant", judged[0]["answer"])], Chars(), "empty"
    )
    assert (
        Chars().decode(ids) == judged[0]["question"] + judged[0]["answer"] + "|"
        and trained(ids, mask) == judged[0]["answer"] + "|"
    )


def test_each_stage_names_its_worker_and_trainer_by_path():
    """A stage is its ``Stage`` entry: the launch imports the classes it names, with no branch on its name."""
    from types import SimpleNamespace

    from mindspeed_rl.config_cls.stage_config import STAGES
    from mindspeed_rl.trainer.stages.stage_launch import stage_parts
    from mindspeed_rl.trainer.stages.stage_trainer import StageTrainer
    from mindspeed_rl.workers.base_worker import StageWorker

    names = {}
    for name, stage in STAGES.items():
        worker, trainer = stage_parts(SimpleNamespace(stage=stage))
        assert issubclass(worker, StageWorker) and issubclass(trainer, StageTrainer)
        names[name] = (worker.__name__, trainer.__name__)
    assert names == {
        "rm": ("RewardModelWorker", "RewardModelTrainer"),
        "sft": ("SFTWorker", "SFTTrainer"),
        "dpo": ("DPOWorker", "DPOTrainer"),
    }
