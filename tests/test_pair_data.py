"""Preference pairs (reward-model training data): configs/datasets/preference_pairs.yaml through the preprocessing
CLI, bad pairs skipped and counted, the stored ids read back."""

import json
import os

import pytest

from cli import preprocess_data
from mindspeed_rl.datasets.prompt_dataset import PromptDataset
from mindspeed_rl.demo.tiny_hf import build_tokenizer

PAIRS = ("chosen_ids", "rejected_ids")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tok"))
    build_tokenizer(folder, [f"what is {a} + {b}? the answer is {a + b}" for a in range(20) for b in range(20)], 512)
    return folder


def preprocess(tmp_path, tokenizer_dir, rows, *extra):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    prefix = str(tmp_path / "pairs")
    args = ["preference_pairs", f"input={path}", f"tokenizer_name_or_path={tokenizer_dir}", f"output_prefix={prefix}"]
    return preprocess_data.main(args + ["workers=1", "--quiet", "prompt_type=empty", *extra]), prefix


def test_pairs_are_stored_as_prompt_chosen_and_rejected_ids(tmp_path, tokenizer_dir, capsys):
    from transformers import AutoTokenizer

    good = [{"prompt": f"what is {a} + 2?", "chosen": f"the answer is {a + 2}", "rejected": f"the answer is {a}"}
            for a in range(4)]  # fmt: skip
    rows = [
        good[0],
        {"prompt": "what is 1 + 1?", "chosen": "the answer is 2"},  # no rejected answer
        {"prompt": "what is 1 + 1?", "chosen": "2", "rejected": " 2"},  # the same tokens: no preference
        good[1],
        {"prompt": "what is 1 + 1?", "chosen": "", "rejected": "3"},
        {"prompt": "what is 1 + 1?", "chosen": ["2"], "rejected": "3"},
        {"prompt": "what is 1 + 1?", "chosen": "2 " * 400, "rejected": "3"},  # prompt + the longer answer > 256
        "{not json",
        good[2],
        good[3],
    ]
    rc, prefix = preprocess(tmp_path, tokenizer_dir, rows, "seq_length=256")
    assert rc == 0, capsys.readouterr()
    assert json.load(open(prefix + "_summary.json")) == {
        "read": 10,
        "kept": 4,
        "skipped": {
            "empty_chosen": 1,
            "identical_pair": 1,
            "malformed_json": 1,
            "missing_key:rejected": 1,
            "not_a_string:chosen": 1,
            "too_long": 1,
        },
    }
    data = PromptDataset(prefix, additional_keys=(), token_fields=PAIRS)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert len(data) == 4
    for i, row in enumerate(good):
        item = data[i]
        assert tok.decode(item["input_ids"]).strip() == row["prompt"]
        for field, key in zip(PAIRS, ("chosen", "rejected")):
            assert item[field][-1] == tok.eos_token_id and tok.decode(item[field][:-1]).strip() == row[key]


def test_a_pair_config_without_its_answer_fields_exits_2(tmp_path, tokenizer_dir, capsys):
    rows = [{"prompt": "what is 1 + 1?", "chosen": "2", "rejected": "3"}]
    rc, _ = preprocess(tmp_path, tokenizer_dir, rows, "map_keys.rejected=''")
    err = capsys.readouterr().err
    assert rc == 2 and "map_keys.rejected" in err and "Traceback" not in err, err
    rc, prefix = preprocess(tmp_path, tokenizer_dir, rows, "dataset_additional_keys=[labels]")
    err = capsys.readouterr().err
    assert rc == 2 and "dataset_additional_keys" in err and not os.path.exists(prefix + "_summary.json"), err
