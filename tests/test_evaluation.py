"""Evaluation (cli/evaluate.py, eval_config): suites read as training reads datasets, rows without an answer skipped
and counted, pass@k / maj@k of scored texts against a brute-force count, bad input refused with exit 2 before any
engine starts. The runs themselves (during training and on the saved checkpoint): tests/test_ppo_e2e.py."""

import itertools
import json
import os
import shutil

import pytest
import torch

from tests.conftest import SHARED


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(demo_assets):
    from mindspeed_rl.utils.hf_tokenizer import load_tokenizer

    return load_tokenizer(demo_assets["tokenizer"], "tokenizer")


def load(specs, tokenizer, demo_assets, prompt_type="empty", limit=0, max_prompt_length=256):
    from mindspeed_rl.evaluation.suites import load_suites

    return load_suites(specs, tokenizer, demo_assets["tokenizer"], prompt_type, max_prompt_length, limit)


def test_suite_metrics_of_scored_texts_equal_a_brute_force_count():
    """Three problems x four texts: pass@k over every k-subset by hand; maj@k's votes read the final answer the way
    the verifier does, equal numbers in any spelling ("1,000" and "1000.0") one ballot."""
    from mindspeed_rl.evaluation.scoring import SuiteSamples, suite_metrics

    texts = [
        ["so #### 1,000", "#### 7", "it is 1000.0", "#### 3"],  # label 1000: right, wrong, right, wrong
        ["#### 5", "#### 5", "#### 5", "#### 2"],  # label 2: only the last
        ["no number", "#### 4", "#### 9", "#### 9"],  # label 4: one right, a majority of 9
    ]
    scores = torch.tensor([[1.0, 0, 1, 0], [0, 0, 0, 1], [0, 1, 0, 0]])
    samples = SuiteSamples(texts, torch.tensor([[3, 4, 5, 6]] * 3), torch.tensor([[False, True, False, False]] * 3))
    got = suite_metrics(scores, samples, "acc_for_ppo", [1, 2, 3, 4])
    correct = (scores >= 1).tolist()
    for k in (1, 2, 3, 4):
        brute = [
            sum(any(row[j] for j in s) for s in itertools.combinations(range(4), k))
            / len(list(itertools.combinations(range(4), k)))
            for row in correct
        ]
        assert got[f"pass@{k}"] == pytest.approx(sum(brute) / 3), k
    # maj@k: the most frequent answer of the first k (ties: the first drawn) is right
    assert got["maj@1"] == pytest.approx(1 / 3)  # only problem 0's first text
    assert got["maj@3"] == pytest.approx(2 / 3)  # problem 0: 1000 twice of three; problem 2: 4 and 9 tie, 4 first
    assert got["maj@4"] == pytest.approx(1 / 3)  # problem 1: 5 wins; problem 2: 9 wins
    assert got["mean@4"] == pytest.approx(4 / 12)
    assert got["response_length/mean"] == 4.5 and got["truncated/rate"] == 0.25 and got["problems"] == 3
    with pytest.raises(ValueError, match="k 5"):
        suite_metrics(scores, samples, "acc_for_ppo", [5])


def test_a_file_opening_with_a_byte_order_mark_keeps_its_first_row(tmp_path):
    from mindspeed_rl.datasets.readers import iter_rows

    rows = [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(map(json.dumps, rows)).encode())
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(rows).encode())
    assert [json.loads(p) for _, p in iter_rows(str(tmp_path / "bom.jsonl"))] == rows
    assert [p for _, p in iter_rows(str(tmp_path / "bom.json"))] == rows


def test_reasoning_gym_votes_read_the_tagged_answer():
    from mindspeed_rl.rewards.registry import answer_reader
    from mindspeed_rl.rewards.verifiers import answer_key

    read = answer_reader("reasoning_gym")
    assert read("<think>2+2</think><answer> 4 </answer>") == "4" and read("4") is None
    assert answer_key("1,000") == answer_key("1000.0") and answer_key("x = 2.") == "x = 2"
    assert answer_key(None) is None and answer_key("  ") is None


def test_no_two_samples_of_an_evaluation_share_a_seed():
    """vLLM seeds a request's n children first + j: problem i's first seed must leave room for its n samples (with
    seed + i, problem i's sample 1 drew problem i+1's sample 0 token for token), and suites draw apart."""
    from mindspeed_rl.evaluation.engine import Sampling

    sampling = Sampling(n=4, temperature=1.0, seed=1)
    gsm8k = [s + j for s in sampling.problem_seeds("gsm8k", 50) for j in range(4)]
    aime = [s + j for s in sampling.problem_seeds("aime", 50) for j in range(4)]
    assert len(set(gsm8k)) == 200 and not set(gsm8k) & set(aime)
    assert sampling.problem_seeds("gsm8k", 50) == sampling.problem_seeds("gsm8k", 50)  # a rerun draws the same
    assert Sampling(n=4, seed=2).problem_seeds("gsm8k", 1) != sampling.problem_seeds("gsm8k", 1)


@pytest.mark.skipif(not os.path.isfile(os.path.join(SHARED, "data", "gsm8k", "test.jsonl")), reason="no ../shared")
def test_gsm8k_test_split_reads_with_its_final_answers(tokenizer, demo_assets):
    path = os.path.join(SHARED, "data", "gsm8k", "test.jsonl")
    (suite,) = load([path], tokenizer, demo_assets, "qwen_r1", max_prompt_length=100_000)  # the demo's tokenizer
    assert suite.name == "test" and suite.verifier == "acc_for_ppo"
    assert len(suite.prompts.input_ids) == 1319 and suite.read == 1319 and not suite.skipped
    assert suite.prompts.labels[:2] == ["18", "3"]  # the text after '####'


def test_math_style_rows_bad_rows_skipped_and_counted(tmp_path, tokenizer, demo_assets):
    rows = [
        {"problem": "What is 2+3?", "solution": "It is \\boxed{5}.", "answer": "5"},
        {"problem": "No answer here."},
        "{not json",
        {"problem": "   ", "answer": "1"},
        {"problem": "Half of 3?", "answer": "\\frac{3}{2}"},
    ]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    (suite,) = load([f"math500={path}"], tokenizer, demo_assets)
    assert suite.name == "math500" and suite.prompts.labels == ["5", "\\frac{3}{2}"]
    assert suite.skipped == {"missing_key:answer": 1, "not_a_json_object": 1, "empty_prompt": 1} and suite.read == 5
    assert "math.jsonl:2: missing_key:answer" in suite.examples[0]
    (first,) = load([f"math500={path}"], tokenizer, demo_assets, limit=1)
    assert first.prompts.labels == ["5"]


def test_a_reasoning_gym_suite_is_generated_and_scored_by_its_tasks(tmp_path, tokenizer, demo_assets):
    from mindspeed_rl.rewards.registry import get_verifier

    spec = tmp_path / "rg.yaml"
    spec.write_text("reasoning_gym: {tasks: [basic_arithmetic], size: 3, seed: 7}\n")
    (suite,) = load([str(spec)], tokenizer, demo_assets)
    assert suite.name == "rg" and suite.verifier == "reasoning_gym" and len(suite.prompts.labels) == 3
    entry = json.loads(suite.prompts.labels[0])
    score = get_verifier("reasoning_gym")
    assert score(f"<answer>{entry['answer']}</answer>", suite.prompts.labels[0]) == 1.0
    assert score("<answer>nonsense</answer>", suite.prompts.labels[0]) < 1.0
    # rows the CLI writes are found to be task entries from their answers
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"question": "q?", "answer": suite.prompts.labels[1]}])
    (from_rows,) = load([rows], tokenizer, demo_assets)
    assert from_rows.verifier == "reasoning_gym" and from_rows.prompts.labels == [suite.prompts.labels[1]]


@pytest.mark.parametrize(
    "content, says",
    [
        ("reasoning_gym: {tasks: [no_such_task]}\n", "no_such_task not in reasoning-gym"),
        ("input: x.jsonl\nreasoning_gym: {tasks: [chain_sum]}\n", "give either input or reasoning_gym"),
        ("input: x.jsonl\nverifer: gsm8k\n", "verifer: unknown key; did you mean 'verifier'"),
        ("input: {x}\nverifier: no_such_verifier\n", "unknown verifier 'no_such_verifier'"),
    ],
)
def test_bad_suite_yaml_is_named(tmp_path, tokenizer, demo_assets, content, says):
    from mindspeed_rl.evaluation.suites import SuiteError

    data = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "1"}])
    spec = tmp_path / "s.yaml"
    spec.write_text(content.replace("{x}", data))
    with pytest.raises(SuiteError, match="") as info:
        load([str(spec)], tokenizer, demo_assets)
    assert says in str(info.value), info.value


def cli(argv, capsys):
    from cli import evaluate

    code = evaluate.main(argv)
    err = capsys.readouterr().err
    return code, err


def test_cli_refuses_bad_input_with_exit_2_before_any_engine(tmp_path, demo_assets, capsys):
    good = write_jsonl(tmp_path / "good.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    unanswered = write_jsonl(tmp_path / "unanswered.jsonl", [{"question": "no answer"}, "oops"])
    unusable = write_jsonl(tmp_path / "unusable.jsonl", [{"question": "", "answer": "1"}, {"question": "q"}])
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    hf = demo_assets["tokenizer"]  # a folder with a tokenizer but no model
    model = tmp_path / "model"  # a HF folder's config and tokenizer (no engine starts on bad input)
    shutil.copytree(hf, model)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest_checkpointed_iteration.txt").write_text("1")
    (tmp_path / "a_file").write_text("")
    base = ["--model", str(model), "--out", str(tmp_path / "out")]
    cases = [
        (["--suite", str(tmp_path / "missing.jsonl")], "missing.jsonl does not exist"),
        (["--suite", empty], "suite empty: " + empty + ": no rows"),
        (["--suite", unanswered], "suite unanswered: " + unanswered + " (first 2 rows): no answer field"),
        (
            ["--suite", unusable],
            "suite unusable: no usable rows (unusable.jsonl:1: empty_prompt; unusable.jsonl:2: missing",
        ),
        (["--suite", good, "--n", "2", "--k", "1,4"], "--k 1,4: each k between 1 and --n 2"),
        (["--suite", good, "--n", "4", "--temperature", "0"], "greedy samples are all the same"),
        (["--suite", good, "--suite", good], "the suite name 'good' is given twice"),
        (["--suite", good, "--prompt-type", "nope"], "unknown prompt_type 'nope'"),
        (["--suite", f"a/b={good}"], "suite name 'a/b': letters, digits"),
        (["--suite", good, "--out", str(tmp_path / "a_file" / "x")], "a_file is a file, not a folder"),
        (["--suite", good, "--temperature", "nan"], "--temperature nan must be a number >= 0"),
        (["--suite", good, "--verifier-workers", "0"], "--verifier-workers 0: at least 1"),
        (["--suite", good, "--tensor-parallel-size", "0"], "--tensor-parallel-size 0: at least 1"),
        (["--suite", good, "--limit", "-1"], "--limit -1: at least 0"),
        (
            ["--suite", good, "--max-new-tokens", "1024"],
            "--max-new-tokens 1024: no room for a prompt in a context of 1024",
        ),
        (["--suite", good, "--max-prompt-length", "1000", "--max-new-tokens", "100"], "exceed the context of 1024"),
    ]
    for extra, says in cases:
        code, err = cli(base + extra + ["--prompt-type", "empty"] * ("--prompt-type" not in extra), capsys)
        assert code == 2 and says in err and "Traceback" not in err, (extra, err)
    code, err = cli(["--model", str(tmp_path / "nowhere"), "--suite", good, "--out", "o"], capsys)
    assert code == 2 and "nowhere: folder does not exist" in err
    code, err = cli(["--model", hf, "--suite", good, "--out", "o", "--prompt-type", "empty"], capsys)
    assert code == 2 and "neither a HF folder (config.json) nor a training checkpoint" in err, err
    code, err = cli(
        ["--model", str(ckpt), "--suite", good, "--out", "o", "--tokenizer", hf, "--prompt-type", "empty"], capsys
    )
    assert code == 2 and "ckpt" in err and "Traceback" not in err, err
    code, err = cli(["--model", str(ckpt), "--suite", good, "--out", "o", "--prompt-type", "empty"], capsys)
    assert code == 2 and "a training checkpoint needs the run's HF tokenizer folder" in err, err
    assert not os.path.exists(tmp_path / "out")  # nothing written
    from cli.evaluate import lengths_of, parse_args

    args = ["--model", str(model), "--suite", good, "--out", "o", "--max-new-tokens", "100"]
    assert lengths_of(parse_args(args)) == (1024, 924)  # prompts keep room for the whole response budget
    (model / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 32768}}))
    assert lengths_of(parse_args(args)) == (4096, 2048)


def test_eval_config_rules_and_plan_line():
    from mindspeed_rl.config_cls.base import ConfigError
    from mindspeed_rl.features import load_ppo_config

    def config(*extra):
        return load_ppo_config("ppo_tiny_cpu", ["+eval_config.suites=[data/x.jsonl]", *extra])

    cfg = config("+eval_config.interval=5", "+eval_config.n=4")
    from mindspeed_rl.features.loop import plan_lines

    line = next(x for x in plan_lines(cfg) if "evaluation:" in x)
    assert "every 5 iterations and after the last" in line and "n 4, temperature 1" in line
    for extra, key in (
        (["+eval_config.n=2", "+eval_config.k=[4]"], "eval_config.k"),
        (["+eval_config.n=2", "+eval_config.temperature=0"], "eval_config.temperature"),
        (["+eval_config.max_new_tokens=100000"], "eval_config.max_new_tokens"),
        (["+eval_config.intervall=3"], "eval_config.intervall"),
    ):
        with pytest.raises(ConfigError) as info:
            config(*extra)
        assert info.value.key == key, info.value
    with pytest.raises(ConfigError, match="at least one suite"):
        load_ppo_config("ppo_tiny_cpu", ["+eval_config.interval=3"])


def test_evaluation_on_the_rollout_engines_samples_as_the_cli_does():
    """Training's top_k, min_p, min_tokens and ignore_eos stay out of evaluation (ignore_eos would truncate every
    response): the same numbers as cli/evaluate.py and the engines of its own."""
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.ppo.evaluation import SuiteEvaluation

    sampling = "generate_config.sampling_config"
    cfg = load_ppo_config(
        "ppo_tiny_cpu",
        ["+eval_config.suites=[data/x.jsonl]", "+eval_config.n=4", "+eval_config.top_p=0.9"]
        + [f"{sampling}.{k}={v}" for k, v in (("top_k", 5), ("min_p", 0.1), ("min_tokens", 2), ("ignore_eos", True))],
    )
    got = SuiteEvaluation(cfg, tokenizer=None, group=object()).sampling  # group: no suites read here
    assert (got.top_k, got.min_p, got.min_tokens, got.ignore_eos) == (-1, 0.0, 0, False)
    assert (got.temperature, got.top_p, got.max_tokens) == (1.0, 0.9, cfg.generate.sampling_config.max_tokens)


def test_the_report_draws_a_panel_per_suite():
    from mindspeed_rl.trainer.report.eval_curves import eval_series, evaluation_figures
    from mindspeed_rl.trainer.report.report import _png

    rows = [
        {"iteration": 0, "eval/gsm8k/pass@1": 0.1, "eval/gsm8k/maj@4": 0.2, "eval/rg/pass@1": 0.0},
        {"iteration": 1, "critic/score/mean": 0.3},
        {"iteration": 5, "eval/gsm8k/pass@1": 0.4, "eval/gsm8k/maj@4": 0.5, "eval/gsm8k/response_length/mean": 9},
    ]
    series = eval_series(rows)
    assert series == {
        "gsm8k": {"pass@1": [(0, 0.1), (5, 0.4)], "maj@4": [(0, 0.2), (5, 0.5)]},
        "rg": {"pass@1": [(0, 0.0)]},
    }
    assert [title for title, _ in evaluation_figures(rows, _png)] == ["Evaluation: gsm8k", "Evaluation: rg"]


@pytest.mark.slow
def test_engines_of_their_own_evaluate_saved_checkpoints_while_training_goes_on(demo_assets, tmp_path):
    """eval_config.engines own: the checkpoint saved at iteration 2 (its save_hf folder) is evaluated on an engine of
    its own on one more device; the trainer does not wait for it, and its results (eval/iteration 2) join the last
    iteration's row."""
    from mindspeed_rl.trainer.launch import train
    from tests.helpers import demo_config

    cfg = demo_config(
        "grpo_tiny_cpu",
        str(tmp_path),
        demo_assets,
        2,
        **{
            "megatron_training.save_interval": 2,
            "actor_config.save_hf": "true",
            "rl_config.test_freq": 0,
            "+eval_config.suites": f"[{demo_assets['raw_test']}]",
            "+eval_config.engines": "own",
            "+eval_config.n": 2,
            "+eval_config.limit": 16,
            "+eval_config.prompt_type": "empty",
        },
    )
    history = train(cfg)
    last = history[-1]
    assert last["iteration"] == 2 and last["eval/iteration"] == 2
    assert {"eval/lucky_test/pass@1", "eval/lucky_test/pass@2", "eval/lucky_test/maj@2"} <= set(last)
    assert 0 <= last["eval/lucky_test/pass@1"] <= last["eval/lucky_test/pass@2"] <= 1
    assert "timing/evaluation" not in last  # nothing ran on the rollout engines
    run = os.path.join(str(tmp_path), "logs", os.listdir(os.path.join(str(tmp_path), "logs"))[0])
    recorded = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    assert [r["eval/iteration"] for r in recorded if "eval/iteration" in r] == [2]


@pytest.mark.slow
def test_the_megatron_core_engine_samples_where_vllm_is_not_asked_for(tmp_path, demo_assets):
    """--backend megatron (auto takes it where vLLM cannot run the model on this device): a HF folder converted on
    the fly, n samples per problem, the same table and results."""
    import subprocess

    from mindspeed_rl.demo.tiny_hf import build_hf_model
    from mindspeed_rl.features import load_ppo_config
    from tests.conftest import PYTHON, ROOT

    model = load_ppo_config("ppo_tiny_cpu").actor.model
    build_hf_model(str(tmp_path / "hf"), model, seed=3, tokenizer_dir=demo_assets["tokenizer"])
    command = [PYTHON, "cli/evaluate.py", "--model", str(tmp_path / "hf"), "--suite", demo_assets["raw_test"]]
    command += ["--prompt-type", "empty", "--n", "2", "--limit", "4", "--max-new-tokens", "6", "--backend", "megatron"]
    done = subprocess.run(command + ["--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "engine: megatron-core (--backend megatron)" in done.stdout
    result = json.load(open(tmp_path / "out" / "results.json"))
    metrics = result["suites"]["lucky_test"]["metrics"]
    assert result["engine"] == "megatron-core" and metrics["problems"] == 4
    assert metrics["truncated/rate"] == 1.0 or metrics["response_length/mean"] < 6  # 6 tokens at most
    samples = [json.loads(x) for x in open(tmp_path / "out" / "lucky_test.samples.jsonl")]
    assert [len(s["responses"]) for s in samples] == [2] * 4 and all(max(s["lengths"]) <= 6 for s in samples)
