"""Rule verifiers registered by name."""

import pytest

from mindspeed_rl.rewards import get_verifier, known_verifiers
from mindspeed_rl.rewards.verifiers import extract_answer


def test_registry_names():
    assert {"acc_for_ppo", "format", "strict_format", "gsm8k", "math"} <= set(known_verifiers())
    with pytest.raises(KeyError, match="acc_for_ppo"):
        get_verifier("nope")


@pytest.mark.parametrize(
    "text,answer",
    [
        ("so the total is \\boxed{72}.", "72"),
        ("\\boxed{\\frac{1}{2}} and later \\boxed{3}", "3"),
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
        ("it costs $1,200 in all", "1,200"),
        ("no digits here", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    "response,label,score",
    [
        ("The answer is \\boxed{72}", "72", 1.0),
        ("The answer is \\boxed{71}", "72", 0.0),
        ("#### 1,200", "1200", 1.0),
        ("x = 0.5", "1/2", 1.0),  # 1/2 is not a plain number: math-verify decides
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("I think 3 then 4", "4", 1.0),
        ("nothing", "4", 0.0),
    ],
)
def test_acc_for_ppo(response, label, score):
    assert get_verifier("acc_for_ppo")(response, label) == score


def test_the_symbolic_limit_counts_cpu_time_not_waiting(caplog):
    """A host busy with other work (here: a sleep, no CPU) does not fail a comparison; computing past the limit
    does, even where the code inside swallows the first interruption; the timer and handler are put back."""
    import signal
    import threading
    import time

    from mindspeed_rl.rewards.verifiers import answers_match, cpu_time_limit

    before = signal.getsignal(signal.SIGVTALRM)
    with cpu_time_limit(0.2) as over:
        time.sleep(0.5)
    assert not over()
    start, caught = time.process_time(), 0
    with pytest.raises(TimeoutError), cpu_time_limit(0.2) as over:
        while time.process_time() - start < 5:
            try:
                sum(range(10_000))
            except TimeoutError:
                caught += 1
                if caught == 1:
                    continue  # swallowed once, as math-verify does: the next 50 ms of CPU raise again
                raise
    assert over() and caught == 2 and time.process_time() - start < 1.0
    assert signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0) and signal.getsignal(signal.SIGVTALRM) is before
    assert answers_match("0.5", "1/2") and not any("Timeout is disabled" in r.message for r in caplog.records)
    found = []
    worker = threading.Thread(target=lambda: found.extend([answers_match("0.5", "1/2"), answers_match("2.0", "2")]))
    worker.start()
    worker.join()
    assert found == [False, True]  # no signal in a thread: numbers compare, symbols do not


def test_format_rewards():
    good = "<think>add them</think> <answer>\\boxed{4}</answer>"
    assert get_verifier("format")(good, "4") == 1.0
    assert get_verifier("strict_format")(good, "4") == 1.0
    assert get_verifier("format")("hi " + good, "4") == 1.0
    assert get_verifier("strict_format")("hi " + good, "4") == 0.0
    assert get_verifier("format")("<answer>4</answer>", "4") == 0.0


def test_rule_reward_runner_weights_and_hung_verifier(capsys):
    import time

    import tests.verifier_plugins  # noqa: F401  (registers test_sleepy)
    from mindspeed_rl.rewards.runner import RuleRewardRunner

    runner = RuleRewardRunner(["acc_for_ppo", "format"], [1.0, 0.5], timeout=5)
    scores, metrics = runner.score(["\\boxed{7}", "<think>x</think><answer>\\boxed{7}</answer>", "8"], ["7", "7", "7"])
    assert scores.tolist() == [1.0, 1.5, 0.0]
    assert metrics["acc_for_ppo_rewards/mean"] == pytest.approx(2 / 3) and metrics[
        "format_rewards/mean"
    ] == pytest.approx(1 / 3)
    runner.close()
    sleepy_runner = RuleRewardRunner(["test_sleepy"], [1.0], timeout=1.0)
    start = time.time()
    scores, metrics = sleepy_runner.score(["ok", "hang", "boom", "ok"], ["", "", "", ""])
    assert time.time() - start < 10
    assert scores.tolist()[0] == 1.0 and scores.tolist()[1] == 0.0 and scores.tolist()[2] == 0.0
    assert scores.tolist()[3] == 1.0
    assert metrics["rule_reward/timeouts"] == 1 and metrics["rule_reward/failures"] == 1
    assert sleepy_runner.score(["ok"], [""])[0].tolist() == [1.0]  # the pool was replaced
    # an infinite score is a failure like a raise: scored 0, counted, the verifier named once
    scores, metrics = sleepy_runner.score(["inf", "ok", "inf"], ["", "", ""])
    assert scores.tolist() == [0.0, 1.0, 0.0] and metrics["rule_reward/failures"] == 2
    out = capsys.readouterr().out
    assert out.count("warning: verifier 'test_sleepy' returned inf for a sample: scored 0") == 1
    sleepy_runner.close()


def test_samples_go_to_each_worker_in_one_call_and_the_timeout_still_counts_per_sample():
    """Each worker scores its share in one call; a share that takes longer than the timeout in all is not hung
    while each of its samples ends within it, and with two workers the hung sample is the one scored 0, its
    worker's other samples sent again to a new pool."""
    import time

    import tests.verifier_plugins  # noqa: F401  (registers test_sleepy)
    from mindspeed_rl.rewards.runner import RuleRewardRunner

    runner = RuleRewardRunner(["test_sleepy"], [1.0], timeout=1.0)
    scores, metrics = runner.score(["slow 0.4"] * 4, [""] * 4)  # 1.6 s in one call, 0.4 s a sample
    assert scores.tolist() == [1.0] * 4 and metrics["rule_reward/timeouts"] == 0
    runner.close()
    runner = RuleRewardRunner(["test_sleepy"], [1.0], timeout=1.0, workers=2)
    responses = ["ok", "slow 0.4", "hang", "slow 0.4", "ok", "slow 0.4", "boom", "ok"]
    start = time.time()
    scores, metrics = runner.score(responses, [""] * len(responses))
    assert time.time() - start < 10
    assert scores.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert metrics["rule_reward/timeouts"] == 1 and metrics["rule_reward/failures"] == 1
    runner.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_that_dies_in_a_sample_scores_it_0_as_hung_and_the_runner_goes_on(workers):
    """A verifier that ends its process (a crash in native code): the pool replaces the worker but not its call, so
    the sample it died in is the one that runs past the timeout, and the others are scored; the next call works."""
    import tests.verifier_plugins  # noqa: F401  (registers test_sleepy)
    from mindspeed_rl.rewards.runner import RuleRewardRunner

    runner = RuleRewardRunner(["test_sleepy"], [1.0], timeout=1.0, workers=workers)
    scores, metrics = runner.score(["ok", "die", "ok", "ok", "slow 0.2", "ok"], [""] * 6)
    assert scores.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0] and metrics["rule_reward/timeouts"] == 1
    assert runner.score(["ok", "ok"], ["", ""])[0].tolist() == [1.0, 1.0]
    runner.close()


def test_an_interrupted_call_leaves_no_values_for_the_next():
    """Values of a call cut short (a KeyboardInterrupt in the driver) must not land on the next call's samples."""
    import tests.verifier_plugins  # noqa: F401  (registers test_sleepy)
    from mindspeed_rl.rewards.runner import RuleRewardRunner

    runner = RuleRewardRunner(["test_sleepy"], [1.0], timeout=5.0)
    runner.score(["ok"], [""])  # the pool started
    real_poll = runner._pipe[0].poll
    calls = []

    def interrupted(timeout):
        calls.append(timeout)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_poll(timeout)

    runner._pipe[0].poll = interrupted
    with pytest.raises(KeyboardInterrupt):
        runner.score(["slow 0.1", "inf", "inf", "inf"], [""] * 4)
    scores, metrics = runner.score(["ok", "ok"], ["", ""])
    assert scores.tolist() == [1.0, 1.0] and metrics["rule_reward/failures"] == 0
    runner.close()


def test_each_worker_is_warmed_up_before_its_samples_are_timed():
    """A verifier whose first call in a process is slow (math-verify importing sympy on a busy host) must not
    hit the per-sample timeout in a new worker, nor in the one that replaces a hung worker."""
    import tests.verifier_plugins as plugins
    from mindspeed_rl.rewards.runner import RuleRewardRunner

    runner = RuleRewardRunner(["test_lazy"], [1.0], timeout=1.0)
    scores, metrics = runner.score(["a", "b", "c"], ["", "", ""])
    assert scores.tolist() == [1.0, 1.0, 1.0] and metrics["rule_reward/timeouts"] == 0
    assert not plugins.FIRST_CALL["done"]  # it ran in the worker, not in this (driver) process
    runner._restart()  # as after a timeout: a fresh worker
    assert runner.score(["d"], [""])[1]["rule_reward/timeouts"] == 0
    runner.close()


def test_a_verifier_the_workers_cannot_see_is_an_error_not_zero_scores():
    from mindspeed_rl.rewards.registry import _REGISTRY, register_verifier
    from mindspeed_rl.rewards.runner import RuleRewardRunner

    if "test_local_only" not in _REGISTRY:
        register_verifier("test_local_only")(lambda response, label: 1.0)  # not at import time of a module
    runner = RuleRewardRunner(["test_local_only"], [1.0], timeout=5)
    with pytest.raises(RuntimeError, match="'test_local_only' is not registered in the worker"):
        runner.score(["a"], [""])
    runner.close()


def test_a_verifier_by_path_runs_in_the_workers_without_registering(monkeypatch):
    """examples/plugins/my_verifiers.py, named module:function: imported by the driver and by each worker."""
    import os

    from mindspeed_rl.rewards.runner import RuleRewardRunner

    plugins = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "plugins")
    monkeypatch.syspath_prepend(plugins)
    monkeypatch.setenv("PYTHONPATH", plugins + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runner = RuleRewardRunner(["acc_for_ppo", "my_verifiers:short_answer"], [1.0, 0.5], timeout=5)
    scores, metrics = runner.score(["#### 7", "#### " + "x" * 100, "#### 8"], ["7", "7", "7"])
    assert scores.tolist() == [1.5, 0.0, 0.5]
    assert metrics["my_verifiers:short_answer_rewards/mean"] == pytest.approx(2 / 3)
    runner.close()


@pytest.mark.parametrize(
    "path,words",
    [
        ("no_such_module_xyz:fn", "cannot import 'no_such_module_xyz' (ModuleNotFoundError"),
        ("mindspeed_rl.rewards.verifiers:nope", "module 'mindspeed_rl.rewards.verifiers' has no 'nope'"),
        ("mindspeed_rl.rewards.verifiers:_NUMBER", "'_NUMBER' is not a function but a Pattern"),
    ],
)
def test_a_verifier_path_that_does_not_import_is_refused_naming_the_key(capsys, path, words):
    from cli import train_ppo

    rc = train_ppo.main(
        [
            "--config-name",
            "ppo_tiny_cpu",
            "dry_run=true",
            f"rl_config.verifier_function=[acc_for_ppo,'{path}']",
            "rl_config.verifier_weight=[1.0,1.0]",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert f"rl_config.verifier_function[1]: '{path}': {words}" in err, err
