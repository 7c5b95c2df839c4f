"""Preprocessing (configs/datasets yaml -> indexed files), bad rows, the prompt dataset and sampler."""

import json
import os

import pytest

from cli import preprocess_data
from mindspeed_rl.datasets.padding import left_pad
from mindspeed_rl.datasets.prompt_dataset import DatasetMissing, PromptDataset, PromptSampler, collate_prompts
from mindspeed_rl.datasets.templates import apply_template
from mindspeed_rl.demo.tiny_hf import build_tokenizer
from tests.conftest import SHARED

GSM8K = os.path.join(SHARED, "data", "gsm8k", "train.jsonl")
pytestmark = pytest.mark.skipif(not os.path.isfile(GSM8K), reason=f"the GSM8K slice {GSM8K} is not present")


@pytest.fixture(scope="module")
def gsm_rows():
    with open(GSM8K) as fh:
        return [json.loads(next(fh)) for _ in range(200)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, gsm_rows):
    folder = str(tmp_path_factory.mktemp("tok"))
    build_tokenizer(folder, [r["question"] for r in gsm_rows] + [r["answer"] for r in gsm_rows], vocab_size=1024)
    return folder


def run(tmp_path, tokenizer_dir, input_path, name="out", *extra):
    prefix = str(tmp_path / name)
    rc = preprocess_data.main(
        [
            "gsm8k",
            f"input={input_path}",
            f"tokenizer_name_or_path={tokenizer_dir}",
            f"output_prefix={prefix}",
            "workers=1",
            "--quiet",
            *extra,
        ]
    )
    return rc, prefix


def write_jsonl(path, rows):
    with open(path, "w") as fh:
        for row in rows:
            fh.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def test_gsm8k_slice_becomes_prompts_with_number_labels(tmp_path, tokenizer_dir, gsm_rows):
    from transformers import AutoTokenizer

    rc, prefix = run(tmp_path, tokenizer_dir, write_jsonl(tmp_path / "g.jsonl", gsm_rows))
    assert rc == 0
    assert json.load(open(prefix + "_summary.json")) == {"read": 200, "kept": 200, "skipped": {}}
    ds = PromptDataset(prefix, ["labels"])
    assert len(ds) == 200
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    for i in (0, 1, 57):
        want_label = gsm_rows[i]["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        assert ds[i]["labels"] == want_label
        text = tok.decode(ds[i]["input_ids"])
        assert text == apply_template("qwen_r1", gsm_rows[i]["question"])
    assert ds[0]["labels"] == "72"


def test_json_parquet_and_folder_inputs_match_jsonl(tmp_path, tokenizer_dir, gsm_rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = gsm_rows[:40]
    _, ref = run(tmp_path, tokenizer_dir, write_jsonl(tmp_path / "a.jsonl", rows), "ref")
    (tmp_path / "arr.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "part1.jsonl", rows[:15])
    (folder / "part2.json").write_text(json.dumps(rows[15:]))
    for name, path in (("json", tmp_path / "arr.json"), ("parquet", tmp_path / "t.parquet"), ("dir", folder)):
        rc, prefix = run(tmp_path, tokenizer_dir, str(path), name)
        assert rc == 0
        for field in ("input_ids", "labels"):
            for ext in (".bin", ".idx"):
                a = open(f"{ref}_packed_{field}_document{ext}", "rb").read()
                assert open(f"{prefix}_packed_{field}_document{ext}", "rb").read() == a, (name, field, ext)


def test_bad_rows_are_skipped_and_counted(tmp_path, tokenizer_dir, gsm_rows, capsys):
    good = gsm_rows[:5]
    rows = [
        good[0],
        "{not json",
        good[1],
        {"answer": "#### 3"},
        {"question": 7, "answer": "#### 1"},
        {"question": "   ", "answer": "#### 2"},
        {"question": "word " * 3000, "answer": "#### 4"},
        "[1, 2]",
        good[2],
        {"question": "no answer"},
        good[3],
    ]
    rc, prefix = run(tmp_path, tokenizer_dir, write_jsonl(tmp_path / "bad.jsonl", rows), "bad", "seq_length=512")
    out = capsys.readouterr().out
    assert rc == 0
    assert json.load(open(prefix + "_summary.json")) == {
        "read": 11,
        "kept": 4,
        "skipped": {
            "empty_prompt": 1,
            "malformed_json": 1,
            "missing_key:answer": 1,
            "missing_key:question": 1,
            "not_a_string:question": 1,
            "not_an_object": 1,
            "too_long": 1,
        },
    }
    assert "skipped bad.jsonl:2: malformed_json" in out
    assert "skipped bad.jsonl:4: missing_key:question" in out
    assert len(PromptDataset(prefix)) == 4


def test_nothing_kept_exits_2_and_writes_no_data(tmp_path, tokenizer_dir, capsys):
    rc, prefix = run(tmp_path, tokenizer_dir, write_jsonl(tmp_path / "x.jsonl", ["{bad", '{"q": 1}']), "none")
    assert rc == 2
    assert "no row was kept" in capsys.readouterr().err
    assert not any(f.endswith((".bin", ".idx", ".part")) for f in os.listdir(tmp_path))


@pytest.mark.parametrize(
    "args,text",
    [
        (["nope_dataset"], "no dataset config"),
        (["gsm8k", "input=/no/such/file.jsonl"], "no such file"),
        (["gsm8k", "workerz=2"], "did you mean 'workers'"),
        (["gsm8k", "workers=0"], "workers"),
        (["gsm8k", "prompt_type=nope"], "prompt_type"),
        (["gsm8k", "handler_name=X"], "handler_name"),
        (["gsm8k", "input=/tmp/readme.txt"], "expected a"),
    ],
)
def test_bad_config_or_input_exits_2(tmp_path, tokenizer_dir, args, text, capsys):
    open("/tmp/readme.txt", "w").close()
    argv = args + [f"tokenizer_name_or_path={tokenizer_dir}", f"output_prefix={tmp_path}/o", "--quiet"]
    if args[0] == "gsm8k" and not any(a.startswith("input=") for a in args):
        argv.append(f"input={GSM8K}")
    assert preprocess_data.main(argv) == 2
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err


def test_two_workers_write_the_same_files(tmp_path, tokenizer_dir, gsm_rows):
    path = write_jsonl(tmp_path / "g.jsonl", gsm_rows)
    _, one = run(tmp_path, tokenizer_dir, path, "w1")
    _, two = run(tmp_path, tokenizer_dir, path, "w2", "workers=2")
    for field in ("input_ids", "labels"):
        assert (
            open(f"{one}_packed_{field}_document.bin", "rb").read()
            == open(f"{two}_packed_{field}_document.bin", "rb").read()
        )


def test_sampler_resumes_exactly_and_covers_epochs():
    straight = PromptSampler(10, 4, seed=3)
    batches = [straight.next_batch() for _ in range(7)]  # 28 samples: crosses two epoch boundaries
    assert sorted(batches[0] + batches[1] + batches[2][:2]) == list(range(10))
    resumed = PromptSampler(10, 4, seed=3)
    for _ in range(3):
        resumed.next_batch()
    state = resumed.state_dict()
    again = PromptSampler(10, 4, seed=3)
    again.load_state_dict(state)
    assert [again.next_batch() for _ in range(4)] == batches[3:]
    assert PromptSampler(10, 4, seed=4).next_batch() != batches[0]
    assert PromptSampler(10, 4, seed=3, shuffle=False).next_batch() == [0, 1, 2, 3]


def test_max_prompt_length_drops_long_prompts(tmp_path, tokenizer_dir, gsm_rows):
    _, prefix = run(tmp_path, tokenizer_dir, write_jsonl(tmp_path / "g.jsonl", gsm_rows))
    full = PromptDataset(prefix)
    lengths = [len(full[i]["input_ids"]) for i in range(len(full))]
    cut = sorted(lengths)[len(lengths) // 2]
    short = PromptDataset(prefix, max_prompt_length=cut)
    assert len(short) == sum(n <= cut for n in lengths) and short.dropped == len(full) - len(short)
    assert all(len(short[i]["input_ids"]) <= cut for i in range(len(short)))


def test_left_padding_and_collate():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    batch = collate_prompts(
        [{"input_ids": [1, 2], "labels": "3", "index": 0}, {"input_ids": [4], "labels": "5", "index": 1}], pad_id=9
    )
    assert batch["input_ids"].tolist() == [[1, 2], [9, 4]] and batch["labels"] == ["3", "5"]


def test_templates():
    assert apply_template("empty", "2+2?") == "2+2?"
    qwen = apply_template("qwen", "hi", query="there")
    assert qwen.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert qwen.endswith("<|im_start|>user\nhi\nthere<|im_end|>\n<|im_start|>assistant\n")
    assert "\\boxed{}" in apply_template("qwen_r1", "x")
    assert apply_template("qwen", "hi", system="").startswith("<|im_start|>user")
    with pytest.raises(KeyError, match="qwen_r1"):
        apply_template("nope", "x")


def test_a_huge_row_is_skipped_as_too_long_without_being_tokenised(tokenizer_dir):
    """A 20 MB question cost 4.9 GB and 56 s to tokenise before its length check; the bound (seq_length x the
    longest vocabulary entry in characters) skips it first."""
    import time

    from transformers import AutoTokenizer

    from mindspeed_rl.datasets.dataset_config import DatasetConfig
    from mindspeed_rl.datasets.handlers import HANDLERS, longest_token

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = DatasetConfig(
        input="x.jsonl",
        tokenizer_name_or_path=tokenizer_dir,
        output_prefix="x",
        seq_length=512,
        handler_name="R1AlpacaStyleInstructionHandler",
        dataset_additional_keys=["labels"],
    )
    handler = HANDLERS[cfg.handler_name](cfg, tokenizer)
    assert handler.longest_token == longest_token(tokenizer) >= max(len(t) for t in tokenizer.get_vocab())
    encoded = []
    real_encode = tokenizer.encode
    tokenizer.encode = lambda text, **kw: encoded.append(len(text)) or real_encode(text, **kw)
    start = time.process_time()  # the work done: the wall clock also counts waits for a core under load
    assert handler.process({"question": "word " * 4_000_000, "answer": "#### 1"}) == (None, "too_long")
    assert encoded == [] and time.process_time() - start < 2
    # a row just within the bound is still tokenised and judged by its real length
    sample, why = handler.process({"question": "What is 2 + 3?", "answer": "#### 5"})
    assert why is None and sample["labels"] == "5" and len(encoded) == 1


def test_a_bin_truncated_under_a_running_job_is_named_not_a_sigbus(tmp_path, tokenizer_dir, gsm_rows):
    """The .bin is memory-mapped: reading a row past a truncation would kill the process with SIGBUS (exit 135,
    a C-level dump); the dataset checks the file first and names it."""
    rc, prefix = run(tmp_path, tokenizer_dir, write_jsonl(tmp_path / "rows.jsonl", gsm_rows[:20]))
    assert rc == 0
    dataset = PromptDataset(prefix)
    first = dataset[0]
    assert first["labels"] and dataset[19]["input_ids"]
    bin_path = f"{prefix}_packed_input_ids_document.bin"
    with open(bin_path, "r+b") as fh:
        fh.truncate(os.path.getsize(bin_path) // 2)
    assert dataset[0] == first  # rows still inside the file read as before
    with pytest.raises(DatasetMissing, match=f"{bin_path} was truncated while the run read it"):
        dataset[19]


def test_a_tokenizer_with_remote_code_is_refused_before_workers_start(tmp_path, gsm_rows, capsys):
    tok = tmp_path / "remote_tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tok.MyTok", None]}, "tokenizer_class": "MyTok"})
    )
    (tok / "tok.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    rc = preprocess_data.main(
        [
            "gsm8k",
            f"input={write_jsonl(tmp_path / 'rows.jsonl', gsm_rows[:4])}",
            f"tokenizer_name_or_path={tok}",
            f"output_prefix={tmp_path / 'out'}",
            "workers=2",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"tokenizer_name_or_path {tok}: the tokenizer needs its own Python code" in err, err
    assert "Traceback" not in err and not (tmp_path / "ran").exists()


def test_reasoning_gym_tasks_become_prompts_their_own_scorers_score(tmp_path, tokenizer_dir, capsys):
    """cli/reasoning_gym_tasks.py -> configs/datasets/reasoning_gym.yaml -> the prompt dataset, whose labels the
    reasoning_gym verifier hands to each task's scorer: the right answer in <answer> tags scores 1, another less,
    none 0; held-out rows with another seed differ; an unknown task exits 2 naming it."""
    from cli import reasoning_gym_tasks
    from mindspeed_rl.rewards.registry import BUILTIN

    tasks = "basic_arithmetic,leg_counting,spell_backward"
    train, test = str(tmp_path / "rg_train.jsonl"), str(tmp_path / "rg_test.jsonl")
    assert reasoning_gym_tasks.main(["--tasks", tasks, "--size", "4", "--seed", "1", "--out", train]) == 0
    assert reasoning_gym_tasks.main(["--tasks", tasks, "--size", "4", "--seed", "2", "--out", test]) == 0
    questions = [[json.loads(line)["question"] for line in open(path)] for path in (train, test)]
    assert len(questions[0]) == 12 and not set(questions[0]) & set(questions[1])
    prefix = str(tmp_path / "rg")
    argv = ["reasoning_gym", f"input={train}", f"tokenizer_name_or_path={tokenizer_dir}", f"output_prefix={prefix}"]
    assert preprocess_data.main(argv + ["workers=1", "--quiet"]) == 0
    ds, score = PromptDataset(prefix, ["labels"]), BUILTIN["reasoning_gym"]
    kinds = set()
    for i in range(len(ds)):
        entry = json.loads(ds[i]["labels"])
        kinds.add(entry["task"])
        assert score(f"<think>...</think> <answer>{entry['answer']}</answer>", ds[i]["labels"]) == 1.0
        assert score("<answer>#</answer>", ds[i]["labels"]) < 0.5  # (some tasks give part credit to near answers)
        assert score("no answer here", ds[i]["labels"]) == 0.0
    assert kinds == set(tasks.split(","))
    assert reasoning_gym_tasks.main(["--tasks", "no_such_task", "--size", "2", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "no_such_task not in reasoning-gym" in capsys.readouterr().err and not os.path.exists(tmp_path / "x.jsonl")
