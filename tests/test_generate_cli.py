"""cli/generate.py on a converted tiny model: greedy output equals HF generate."""

import json

import pytest
import torch

from cli import convert_ckpt, generate
from mindspeed_rl.demo.tiny_hf import build_hf_model, build_tokenizer
from tests.helpers import tiny_model_config

TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Betty is saving money for a new wallet which costs $100.",
    "#### 72",
    "The answer is 10.",
] * 20


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    tok = build_tokenizer(str(root / "tok"), TEXTS, vocab_size=300)
    model = tiny_model_config(num_layers=2, padded_vocab_size=len(tok))
    hf = build_hf_model(str(root / "hf"), model, seed=3, tokenizer_dir=str(root / "tok"))
    assert (
        convert_ckpt.main(
            [
                "--load-model-type",
                "hf",
                "--save-model-type",
                "mg",
                "--load-dir",
                str(root / "hf"),
                "--save-dir",
                str(root / "mg"),
                "--target-tensor-parallel-size",
                "2",
                "--add-qkv-bias",
            ]
        )
        == 0
    )
    prompts = ["Natalia sold clips", "Betty is saving", "The answer"]
    with open(root / "prompts.jsonl", "w") as fh:
        fh.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
    return root, tok, hf, prompts


def test_greedy_generation_equals_hf_generate(converted):
    root, tok, hf, prompts = converted
    assert (
        generate.main(
            [
                "--load-dir",
                str(root / "mg"),
                "--tokenizer-name-or-path",
                str(root / "tok"),
                "--input",
                str(root / "prompts.jsonl"),
                "--output",
                str(root / "out.jsonl"),
                "--max-new-tokens",
                "12",
                "--temperature",
                "0",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in open(root / "out.jsonl")]
    assert [r["prompt"] for r in rows] == prompts
    for row in rows:
        ids = torch.tensor([tok.encode(row["prompt"], add_special_tokens=False)])
        with torch.no_grad():
            want = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=12,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )[0, ids.shape[1] :]
            full = torch.cat([ids[0], want]).unsqueeze(0)
            logp = hf(full).logits[0, ids.shape[1] - 1 : -1].log_softmax(-1).gather(-1, want[:, None]).squeeze(-1)
        assert row["token_ids"] == want.tolist()
        assert max(abs(a - b) for a, b in zip(row["logprobs"], logp.tolist())) <= 1e-4
        assert row["response"] == tok.decode(want, skip_special_tokens=True)


def test_seeded_sampling_is_reproducible_and_hf_folder_loads(converted):
    root, _, _, _ = converted
    outs = []
    for name in ("a", "b"):
        assert (
            generate.main(
                [
                    "--load-dir",
                    str(root / "hf"),
                    "--input",
                    str(root / "prompts.jsonl"),
                    "--output",
                    str(root / f"{name}.jsonl"),
                    "--max-new-tokens",
                    "8",
                    "--temperature",
                    "1.0",
                    "--seed",
                    "4",
                ]
            )
            == 0
        )
        outs.append([json.loads(line)["token_ids"] for line in open(root / f"{name}.jsonl")])
    assert outs[0] == outs[1]


def test_bad_input_exits_2(converted, tmp_path, capsys):
    root, _, _, _ = converted
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    assert (
        generate.main(
            [
                "--load-dir",
                str(root / "mg"),
                "--tokenizer-name-or-path",
                str(root / "tok"),
                "--input",
                str(bad),
                "--output",
                str(tmp_path / "o.jsonl"),
            ]
        )
        == 2
    )
    assert "bad.jsonl:2" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "crafted"])
def test_a_truncated_or_crafted_checkpoint_exits_2_naming_the_file(converted, tmp_path, capsys, damage):
    import os
    import shutil

    root, _, _, prompts = converted
    mg = tmp_path / "mg"
    shutil.copytree(root / "mg", mg)
    rank_file = mg / "release" / "mp_rank_01" / "model_optim_rng.pt"
    if damage == "truncated":
        with open(rank_file, "r+b") as fh:
            fh.truncate(os.path.getsize(rank_file) // 2)
    else:
        marker = tmp_path / "pwned"
        torch.save({"model": {}, "config": RunsACommand(str(marker))}, rank_file)
    rc = generate.main(
        [
            "--load-dir",
            str(mg),
            "--tokenizer-name-or-path",
            str(root / "tok"),
            "--input",
            str(root / "prompts.jsonl"),
            "--output",
            str(tmp_path / "o.jsonl"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and str(rank_file) in err and "Traceback" not in err, err
    assert ("truncated or corrupt" if damage == "truncated" else "refused to load") in err
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "o.jsonl").exists()


class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))
