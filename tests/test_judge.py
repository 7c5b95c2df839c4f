"""The generative judge's template, score parsing and HTTP client against a misbehaving OpenAI-compatible server
on the loopback interface: down, slow, erroring once, answering garbage or without a score. Each failure is
scored on_failure and counted; nothing waits past its timeout. In the rollout source, groups that finish early are
judged while the rest generates, and score exactly as when judged at once."""

import functools
import json
import os
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from mindspeed_rl.rewards.judge import DEFAULT_TEMPLATE, HttpJudge, parse_score, render
from mindspeed_rl.rewards.judge import Judge as JudgeBase
from tests.rollout_fakes import TOK, ScriptedService, continue_text


def test_scores_are_parsed_from_the_last_score_line_and_normalised():
    assert parse_score("fine.\nScore: 7") == (0.7, None)
    assert parse_score("Score: 2 ... on reflection, score = 10") == (1.0, None)
    assert parse_score("**Score:** 5") == (0.5, None)
    assert parse_score("the grade is \\boxed{4}") == (0.4, None)
    assert parse_score("looks right to me") == (None, "no_score")
    assert parse_score("Score: 11") == (None, "out_of_range")
    assert parse_score("Score: 3", score_min=1, score_max=5) == (0.5, None)


def test_the_template_fills_its_three_fields_and_leaves_other_braces():
    text = render('{prompt}|{response}|{label}|{other} {"json": 1}', "2+{x}?", "4", "4")
    assert text == '2+{x}?|4|4|{other} {"json": 1}'
    assert "{prompt}" not in render(DEFAULT_TEMPLATE, "q", "r", "l")


class Judge(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/chat/completions that grades by what the prompt asks of it."""

    calls = {}
    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][0]["content"]
        if "ENDLESS" in text or "HUGE" in text:
            return self._flood(declared="HUGE" in text)
        if "INFLATES" in text:
            return self._inflating()
        if "DRIP" in text:
            return self._drip()
        busy = "BUSY" in text  # counted in flight (the slow test's requests may still sleep here)
        with Judge.lock:
            Judge.calls[text] = Judge.calls.get(text, 0) + 1
            Judge.in_flight += busy
            Judge.most_in_flight = max(Judge.most_in_flight, Judge.in_flight)
        try:
            if "SLOW" in text:
                time.sleep(3)
            elif busy:
                time.sleep(0.2)
            if "FLAKY" in text and Judge.calls[text] == 1:
                return self._send(500, b'{"error": "try again"}')
            if "GARBAGE" in text:
                return self._send(200, b"<html>not json</html>")
            content = "I cannot tell." if "NOSCORE" in text else "Checked the sum.\nScore: 8"
            if "SPACES" in text:  # the quadratic case of the old pattern: 9 s for 20,000 spaces
                content = "Score:" + " " * 60000 + "x"
            reply = {"id": "1", "object": "chat.completion", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": content}}]}  # fmt: skip
            coding = next((c for c in ("gzip", "deflate") if c.upper() in text), None)
            self._send(200, json.dumps(reply).encode(), coding)
        finally:
            with Judge.lock:
                Judge.in_flight -= busy

    def _flood(self, declared: bool):
        """A body that never ends (chunked), or one of 50 MB announced by its Content-Length; at most 20 s, so the
        server stops by itself."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header(*(("Content-Length", str(50 << 20)) if declared else ("Transfer-Encoding", "chunked")))
        self.end_headers()
        end = time.monotonic() + 20
        try:
            for i in range(800):
                if time.monotonic() > end:
                    break
                chunk = b'{"choices": [{"message": {"content": "' if i == 0 else b"x" * (64 << 10)
                self.wfile.write(chunk if declared else b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:  # the client stopped reading: what it should do
            pass

    def _inflating(self):
        """A gzip body of 200 KB that inflates to 200 MB (the start of a JSON answer, then zeros)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(zeros_gzip())))
        self.end_headers()
        try:
            self.wfile.write(zeros_gzip())
        except OSError:  # the client stopped reading
            pass

    def _drip(self):
        """A body of a byte every 0.1 s (no socket timeout fires), for 20 s at most."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "200")
        self.end_headers()
        try:
            for _ in range(200):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass

    def _send(self, code, payload, coding=None):
        if coding:
            packer = zlib.compressobj(wbits=zlib.MAX_WBITS | 16 if coding == "gzip" else zlib.MAX_WBITS)
            payload = packer.compress(payload) + packer.flush()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if coding:
            self.send_header("Content-Encoding", coding)
        self.end_headers()
        self.wfile.write(payload)


@functools.lru_cache(maxsize=1)
def zeros_gzip(megabytes: int = 200) -> bytes:
    """'{"choices": [{"message": {"content": "' and ``megabytes`` MB of zeros, gzipped a megabyte at a time."""
    packer = zlib.compressobj(1, wbits=zlib.MAX_WBITS | 16)
    parts = [packer.compress(b'{"choices": [{"message": {"content": "')]
    zeros = b"0" * (1 << 20)
    parts += [packer.compress(zeros) for _ in range(megabytes)]
    return b"".join(parts) + packer.flush()


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that stopped reading (the cap): nothing to say
        pass


@pytest.fixture(scope="module")
def server():
    httpd = QuietServer(("127.0.0.1", 0), Judge)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_every_failure_is_scored_as_configured_and_counted(server):
    judge = HttpJudge(server, "judge", template="{response}", timeout=0.5, retries=1, on_failure=-1.0)
    responses = ["GOOD", "SLOW", "FLAKY", "GARBAGE", "NOSCORE", "GOOD too"]
    judge.grade(["q"], ["GOOD"], [""])  # the client's modules imported before the clock starts (4 s under load)
    start = time.perf_counter()
    verdicts, metrics = judge.grade(["q"] * 6, responses, [""] * 6)
    took = time.perf_counter() - start
    assert [v.score for v in verdicts] == [0.8, -1.0, 0.8, -1.0, -1.0, 0.8]
    assert [v.failure for v in verdicts] == [None, "request_failed", None, "request_failed", "no_score", None]
    assert Judge.calls["FLAKY"] == 2  # the 500 was retried
    assert metrics["judge/request_failures"] == 2 and metrics["judge/parse_failures"] == 1
    assert took < 2 * 0.5 + 3, took  # the slow request gave up at its timeout (twice), not after the server's 3 s


def test_a_calls_deadline_fails_what_is_unfinished_and_keeps_what_is_done(server):
    judge = HttpJudge(server, "judge", template="{response}", concurrency=1, timeout=10, retries=0, deadline=1.0)
    start = time.perf_counter()
    verdicts, metrics = judge.grade(["q"] * 3, ["GOOD", "SLOW deadline", "GOOD again"], [""] * 3)
    assert time.perf_counter() - start < 2.5  # not the slow request's 3 s, nor its 10 s timeout
    assert [v.failure for v in verdicts] == [None, "request_failed", "request_failed"]  # one at a time
    assert verdicts[0].score == 0.8 and metrics["judge/request_failures"] == 2


def test_parsing_takes_linear_time_and_a_users_pattern_a_bounded_one():
    for spaces in (20000, 60000):  # 9 s and ~80 s with the old pattern
        start = time.process_time()  # the work done, not the wait for a core another test holds
        assert parse_score("Score:" + " " * spaces + "x") == (None, "no_score")
        assert parse_score("Score:" + " " * (spaces // 10) + "7") == (0.7, None)
        assert time.process_time() - start < 0.1
    start = time.perf_counter()  # a user's pattern that backtracks exponentially gives up at its time limit
    assert parse_score("x" * 5000, pattern=r"(x+x+)+y(\d)") == (None, "parse_timeout")
    assert parse_score("x" * 5000, pattern=r"(x+x+)+y(\d)", seconds=0.05) == (None, "parse_timeout")
    assert time.perf_counter() - start < 1.5
    assert parse_score("Score: 3" + "." * 20000) == (None, "no_score")  # only the answer's end is searched


def test_answers_of_spaces_are_parsed_within_the_calls_deadline(server):
    judge = HttpJudge(server, "judge", template="{response}", concurrency=4, timeout=5, retries=0, deadline=8.0)
    start = time.perf_counter()  # four such answers took 349 s against this deadline
    verdicts, metrics = judge.grade(["q"] * 4, [f"SPACES {i}" for i in range(4)], [""] * 4)
    assert time.perf_counter() - start < 3
    assert [v.failure for v in verdicts] == ["no_score"] * 4 and metrics["judge/parse_failures"] == 4
    slow = HttpJudge(server, "judge", template="{response}", score_pattern=r"(x+x+)+y(\d)", deadline=0.3)
    start = time.perf_counter()  # a slow pattern cannot outlast the deadline either
    verdicts, _ = slow.grade(["q"] * 4, [f"SPACES {i}" for i in range(4)], [""] * 4)
    assert time.perf_counter() - start < 1.5


@pytest.mark.parametrize("kind", ["ENDLESS", "HUGE"])
def test_an_endless_or_huge_answer_is_read_up_to_the_cap_and_counted(server, kind):
    import tracemalloc

    judge = HttpJudge(server, "judge", template="{response}", timeout=5, retries=2, deadline=30)
    assert judge.max_response_bytes == 16 * 512 + (64 << 10)
    judge.grade(["q"], ["GOOD"], [""])  # the client's modules imported before memory is traced
    tracemalloc.start()
    start = time.perf_counter()
    try:
        verdicts, metrics = judge.grade(["q"] * 2, [kind, "GOOD"], [""] * 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 5  # an endless body grew the driver by 5.5 GB in 30 s before
    assert peak < 16 << 20, peak  # was 586 MB for a 50 MB body
    assert [v.failure for v in verdicts] == ["oversized", None] and verdicts[1].score == 0.8
    assert metrics["judge/request_failures"] == 1
    tight = HttpJudge(server, "judge", template="{response}", max_response_bytes=100)
    assert [v.failure for v in tight.grade(["q"], ["GOOD"], [""])[0]] == ["oversized"]  # the cap is the key's


@pytest.mark.parametrize("coding", ["GZIP", "DEFLATE"])
def test_a_compressed_answer_under_the_cap_is_decoded_and_scored(server, coding):
    judge = HttpJudge(server, "judge", template="{response}", timeout=5, retries=0, max_response_bytes=1024)
    verdicts, metrics = judge.grade(["q"] * 2, [coding, f"{coding} NOSCORE"], [""] * 2)
    assert [v.failure for v in verdicts] == [None, "no_score"] and verdicts[0].score == 0.8
    assert verdicts[1].reply == "I cannot tell."


def test_a_gzip_answer_that_inflates_past_the_cap_is_stopped_there_and_counted(server):
    """200 KB of gzip inflating to 200 MB: the cap counts the inflated bytes as they come (a body that inflated
    to 8 GB grew the driver past 5 GB and outlasted its deadline before)."""
    import tracemalloc

    assert len(zeros_gzip()) < 1 << 20  # compressed before the clock and the memory count start
    cap = 1 << 20  # over the compressed body, far under what it inflates to
    judge = HttpJudge(server, "judge", template="{response}", timeout=5, retries=1, deadline=10, max_response_bytes=cap)
    judge.grade(["q"], ["GOOD"], [""])  # the client's modules imported before memory is traced
    tracemalloc.start()
    start = time.perf_counter()
    try:
        verdicts, metrics = judge.grade(["q"] * 2, ["INFLATES", "GOOD"], [""] * 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 3
    assert peak < 16 << 20, peak
    assert [v.failure for v in verdicts] == ["oversized", None] and verdicts[1].score == 0.8
    assert metrics["judge/request_failures"] == 1


def test_a_body_that_drips_fails_at_the_requests_timeout_though_no_socket_timeout_fires(server):
    judge = HttpJudge(server, "judge", template="{response}", timeout=1.0, retries=1, deadline=None)
    start = time.perf_counter()
    verdicts, metrics = judge.grade(["q"] * 2, ["DRIP", "GOOD"], [""] * 2)
    assert time.perf_counter() - start < 2 * 1.0 + 1.5  # two tries of 1 s (and the retry's wait), not 20 s
    assert [v.failure for v in verdicts] == ["request_failed", None] and metrics["judge/request_failures"] == 1


def test_a_judge_that_is_down_fails_fast_and_concurrency_is_bounded(server):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = HttpJudge(f"http://127.0.0.1:{port}/v1", "judge", timeout=1.0, retries=0)
    start = time.perf_counter()
    verdicts, metrics = down.grade(["q"] * 3, ["a", "b", "c"], ["", "", ""])
    assert metrics["judge/request_failures"] == 3 and all(v.score == 0.0 for v in verdicts)
    assert time.perf_counter() - start < 2
    Judge.most_in_flight = 0
    busy = HttpJudge(server, "judge", template="{response}", concurrency=2, timeout=5.0)
    verdicts, _ = busy.grade(["q"] * 6, [f"BUSY {i}" for i in range(6)], [""] * 6)
    assert [v.score for v in verdicts] == [0.8] * 6 and Judge.most_in_flight == 2


# ----- the judge in the rollout source: finished groups judged while the others generate ----------------------
class RuleJudge(JudgeBase):
    """A judge that takes its time and grades as the scripted task's rule does (template "{response}|{label}")."""

    def _answers(self, texts):
        time.sleep(0.02 * len(texts) ** 0.5)
        return ["Score: 10" if f"#### {t.rsplit('|', 1)[1]}" in t.rsplit("|", 1)[0] else "Score: 0" for t in texts]


class SlowService(ScriptedService):
    """Each generation round takes 30 ms, as a real engine's would; prompts ``Q: a*b?`` with an even a are answered
    at once (their groups finish in the first round), the others call the calculator first (a second round)."""

    def __init__(self):
        super().__init__(lambda context, seed: continue_text(context, seed, tag="A" if even_a(context) else "C"))

    def collect(self, handle):
        time.sleep(0.03)
        return super().collect(handle)


def even_a(context: str) -> bool:
    return int(context.split("Q: ", 1)[1].split("*", 1)[0]) % 2 == 0


def judged_source(overlap, split=1, ds=False):
    from types import SimpleNamespace

    from mindspeed_rl.trainer.ppo.scoring import Scorer
    from tests.test_rollout_layers import make_source

    cfg = SimpleNamespace(
        rl=SimpleNamespace(rule_reward=False, overlong_buffer_enable=False),
        generate=SimpleNamespace(sampling_config=SimpleNamespace(max_tokens=320)),
        judge=SimpleNamespace(weight=1.0, overlap=overlap),
    )
    scorer = Scorer(cfg, None, None, TOK, RuleJudge(template="{response}|{label}"))
    source = make_source("tool_agent", ds=ds, split=split, service=SlowService())
    if ds:  # dynamic sampling on the judge's score: which groups it keeps, and so when to draw, wait on verdicts
        source.filter.metric = "score"
    from mindspeed_rl.rollout.source.scoring_stage import scoring_stage

    source.scoring = scoring_stage(scorer, source.rows_of, overlap)
    return source, scorer


@pytest.mark.parametrize("split,ds", [(1, False), (4, False), (1, True)])
def test_groups_are_judged_while_the_rest_generates_and_score_as_judged_at_once(split, ds):
    """Synchronous rounds (the tool agent), partial rollout (split 4), dynamic sampling on the judge's score: the
    same batches either way."""
    from tests.test_rollout_layers import fingerprint, run

    batches = {}
    for overlap in (False, True):
        source, scorer = judged_source(overlap, split, ds)
        batches[overlap] = [batch for batch, _ in run(source, 3)]
        scorer.close()
    for plain, deferred in zip(batches[False], batches[True]):
        assert fingerprint(plain) == fingerprint(deferred)  # the same groups, in the same order, the same scores
        # (judge/score_mean is over every response judged in the production: judged early, a round may finish
        # more groups for the next batch, so it may differ)
        assert 0 <= deferred.metrics["judge/score_mean"] <= 1 and deferred.clock.timing["timing/judge"] > 0
        assert "judge/overlap_share" not in plain.metrics and plain.clock.timing["timing/judge"] > 0
    scores = torch.cat([b.experience.scores for b in batches[True]])
    assert 0 < scores.mean() < 1  # the judge's verdicts differ: right and wrong answers
    shares = [b.metrics["judge/overlap_share"] for b in batches[True]]
    assert all(0.0 <= s <= 1.0 for s in shares), shares
    if split == 1 and not ds:
        assert max(shares) > 0.1, shares  # groups judged behind the rounds


def test_an_mcore_judge_folder_is_converted_for_vllm_with_the_same_weights(tmp_path):
    """judge_config.load may be an mcore checkpoint: the run converts it into <run dir>/judge_hf; a HF folder is
    used as it is."""
    from types import SimpleNamespace

    from safetensors.torch import load_file

    from mindspeed_rl.checkpoint.convert import hf_to_mg
    from mindspeed_rl.demo.tiny_hf import build_hf_model, build_tokenizer
    from mindspeed_rl.trainer.ppo.judging import judge_hf_folder
    from tests.helpers import tiny_model_config

    model = tiny_model_config()
    tok = str(tmp_path / "tok")
    build_tokenizer(tok, ["the lucky number is 7"] * 4, vocab_size=model.padded_vocab_size, pad_to_vocab=True)
    hf = str(tmp_path / "hf")
    build_hf_model(hf, model, seed=2, tokenizer_dir=tok)
    hf_to_mg(hf, str(tmp_path / "mcore"), tp=2, model_type_hf="qwen25")

    def cfg(load):
        return SimpleNamespace(judge=SimpleNamespace(load=load),
                               actor=SimpleNamespace(megatron=SimpleNamespace(tokenizer_name_or_path=tok)))  # fmt: skip

    assert judge_hf_folder(cfg(hf), str(tmp_path / "run")) == hf
    out = judge_hf_folder(cfg(str(tmp_path / "mcore")), str(tmp_path / "run"))
    assert out == str(tmp_path / "run" / "judge_hf") and os.path.isfile(os.path.join(out, "tokenizer.json"))
    original, converted = (
        load_file(os.path.join(hf, "model.safetensors")),
        load_file(os.path.join(out, "model.safetensors")),
    )
    assert set(converted) == set(original)
    assert all(torch.equal(converted[k].float(), original[k].float()) for k in original)


ENGINE_KEYS_SET = ("load", "dtype", "max_model_len", "max_num_batched_tokens", "gpu_memory_utilization")  # the demo's


@pytest.mark.parametrize(
    "overrides, key, text",
    [
        (["~judge_config"], "rl_config.judge_resource", "no judge_config"),
        (["~rl_config.judge_resource"], "rl_config.judge_resource", "required with judge_config.serve engines"),
        (["~judge_config.load"], "judge_config.load", "required with serve engines"),
        (["judge_config.serve=http"], "judge_config.base_url", "required with serve http"),
        (["judge_config.template='{prompt} only'"], "judge_config.template", "has no {response}"),
        (["judge_config.score_max=0"], "judge_config.score_max", "not above score_min"),
        (["judge_config.score_pattern='score'"], "judge_config.score_pattern", "needs a group"),
        (["judge_config.infer_tensor_parallel_size=2"], "judge_config.infer_tensor_parallel_size", "does not divide"),
        (["rl_config.rule_reward=false", "~judge_config", "~rl_config.judge_resource"], "rl_config.rule_reward",
         "nothing would score"),
    ],
)  # fmt: skip
def test_the_judge_config_refuses_what_cannot_run(overrides, key, text, capsys):
    from tests.helpers import assert_refused

    assert_refused(["--config-name", "grpo_tiny_cpu_judge", "dry_run=true"] + overrides, key, text, capsys)


def test_serving_the_judge_over_http_is_one_key_over_a_config_written_for_engines(capsys):
    """The command in configs/grpo_tiny_cpu_judge.yaml's comment, as it stands there: the engine keys and the judge's
    devices are reported unused in one plan line, and nothing asks for the engines' folder; the other way round
    (an endpoint key left in a config served by engines) is the same note."""
    from cli import train_ppo
    from mindspeed_rl.config_cls.loader import CONFIG_DIR

    with open(os.path.join(CONFIG_DIR, "grpo_tiny_cpu_judge.yaml"), encoding="utf-8") as fh:
        comment = [line.strip("# \\\n") for line in fh if line.startswith("#")]
    start = next(i for i, line in enumerate(comment) if "judge_config.serve=http" in line)
    command = " ".join(comment[start : start + 2]).split()
    assert command[:4] == [".venv/bin/python", "cli/train_ppo.py", "--config-name", "grpo_tiny_cpu_judge"], command
    assert train_ppo.main(command[2:] + ["dry_run=true"]) == 0
    out = capsys.readouterr().out
    unused = [line for line in out.splitlines() if "not used with serve http" in line]
    assert len(unused) == 1 and "judge_config.load" in unused[0] and "rl_config.judge_resource" in unused[0], out
    assert "tiny_judge_hf" not in out.replace(unused[0], "")  # the engines' folder is neither checked nor loaded
    assert train_ppo.main(["--config-name", "grpo_tiny_cpu_judge", "dry_run=true", "+judge_config.timeout=5"]) == 0
    assert "not used with serve engines: judge_config.timeout" in capsys.readouterr().out
