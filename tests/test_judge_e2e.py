"""The generative judge served both ways, end to end on this CPU, with a small untrained judge model (its replies
are noise; the score pattern takes their first digit, so verdicts are parsed, not guessed):

- its own vLLM engines on a placement-group bundle of their own, in a GRPO run scored by the judge alone;
- vLLM's OpenAI-compatible server started here on the loopback interface: completions graded, a chat request the
  model cannot serve (it has no chat template) and a server that went away, each counted, none waiting past its
  timeout.
"""

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import demo_config

PATTERN = r"(\d)"  # the first digit of the judge's reply: 0..9


@pytest.fixture(scope="module")
def judge_model(demo_assets, tmp_path_factory):
    from mindspeed_rl.demo.tiny_hf import build_hf_model
    from mindspeed_rl.features import load_ppo_config

    out = str(tmp_path_factory.mktemp("judge") / "hf")
    build_hf_model(out, load_ppo_config("grpo_tiny_cpu").actor.model, seed=3, tokenizer_dir=demo_assets["tokenizer"])
    return out


@pytest.mark.slow
def test_a_grpo_run_scored_by_the_judge_on_engines_of_its_own(judge_model, demo_assets, tmp_path):
    from mindspeed_rl.trainer.launch import train

    cfg = demo_config(
        "grpo_tiny_cpu_judge",
        str(tmp_path),
        demo_assets,
        2,
        **{"judge_config.load": judge_model, "judge_config.score_pattern": f"'{PATTERN}'", "judge_config.score_max": 9},
    )
    assert cfg.world_size == 2  # the actor's slot and the judge's
    history = train(cfg)
    assert [m["iteration"] for m in history] == [1, 2]
    for m in history:
        assert m["timing/judge"] > 0 and m["judge/request_failures"] == 0
        assert m["judge/parse_failures"] < 128  # the noise holds digits: most replies are parsed
        # the judge is the only reward (the verifier's weight is 0): the batch's mean score is its mean verdict
        assert abs(m["critic/score/mean"] - m["judge/score_mean"]) < 1e-5, m
        assert 0 < m["judge/score_mean"] < 1 and "acc_for_ppo_rewards/mean" in m


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(judge_model, tmp_path_factory):
    """vLLM's OpenAI-compatible server for the judge model on 127.0.0.1 (a small KV cache), until the module ends."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("server") / "vllm_server.log", "w")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", judge_model, "--served-model-name",
         "judge", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "256",
         "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20)],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(1)
    import urllib.request

    while time.monotonic() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(url + "/models", timeout=2)
            break
        except OSError:
            time.sleep(1)
    if process.poll() is not None or time.monotonic() >= deadline:
        process.kill()
        pytest.fail(f"vLLM's server did not start: {open(log.name).read()[-2000:]}")
    yield url, process
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.mark.slow
def test_the_http_judge_against_vllms_openai_server(vllm_server):
    from mindspeed_rl.rewards.judge import HttpJudge

    url, process = vllm_server
    template = "{prompt}\n{response}\nLucky number is {label}.\nGrade 0 or 1\n"
    prompts, responses, labels = (
        ["Bo has 2 pears. Say the lucky number."] * 12,
        [f"is {d}." for d in range(12)],
        ["7"] * 12,
    )
    # sampled (an untrained model's greedy reply repeats one token), long enough to hold digits
    judge = HttpJudge(url, "judge", template=template, api="completions", max_tokens=16, temperature=1.0,
                      score_pattern=PATTERN, score_max=9, concurrency=4, timeout=30, retries=0)  # fmt: skip
    verdicts, metrics = judge.grade(prompts, responses, labels)
    assert metrics["judge/request_failures"] == 0 and len(verdicts) == 12
    assert all(v.reply for v in verdicts) and metrics["judge/parse_failures"] < 12, [v.reply for v in verdicts]
    assert all(0.0 <= v.score <= 1.0 for v in verdicts)
    assert all(v.failure == "no_score" for v in verdicts if v.score == 0.0 and "0" not in v.reply)

    # a chat request the model cannot serve (no chat template): an HTTP error, counted, scored on_failure
    chat = HttpJudge(url, "judge", template=template, api="chat", on_failure=-1.0, timeout=30, retries=0)
    verdicts, metrics = chat.grade(prompts[:3], responses[:3], labels[:3])
    assert metrics["judge/request_failures"] == 3 and [v.score for v in verdicts] == [-1.0] * 3

    # the server goes away: every request fails fast and is counted
    process.terminate()
    process.wait(30)
    start = time.perf_counter()
    verdicts, metrics = judge.grade(prompts[:4], responses[:4], labels[:4])
    assert metrics["judge/request_failures"] == 4 and all(v.score == 0.0 for v in verdicts)
    assert time.perf_counter() - start < 10
