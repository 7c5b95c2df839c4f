"""Library chatter goes to a log file; our messages and the library lines that matter reach the console."""

import logging
import os
import subprocess
import sys
import textwrap

from mindspeed_rl.utils import library_logs

WORKER = textwrap.dedent("""
    import logging, os, sys, warnings
    from mindspeed_rl.utils.library_logs import route_process_output
    route_process_output()
    print("a print from a library")
    os.write(2, b"[W utils.cpp:68] Warning: NUMA binding from C++\\n")
    logging.getLogger("vllm.model_executor.layerwise").warning("RotaryEmbedding: Failed to load weights")
    logging.getLogger("vllm.v1.core.sched").warning("Sequence group 3 is preempted: not enough KV cache space")
    logging.getLogger("megatron.core.optimizer").error("gradient all-reduce failed")
    logging.getLogger("mindspeed_rl.rollout.engines.factory").warning("rollout engine: vLLM (cpu, infer TP 1)")
    logging.getLogger("mindspeed_rl.accelerator").info("compatibility applied")
    warnings.warn("full scope is deprecated", UserWarning)
""")


def test_worker_output_is_routed_to_its_file_and_what_matters_to_the_console(tmp_path):
    log = tmp_path / "logs" / "actor_0.log"
    proc = subprocess.run(
        [sys.executable, "-c", WORKER],
        capture_output=True,
        text=True,
        env=dict(os.environ, MINDSPEED_RL_LOG_FILE=str(log), PYTHONWARNINGS="default"),
    )
    assert proc.returncode == 0, proc.stderr
    console = proc.stdout.splitlines()
    assert console == [
        "WARNING vllm.v1.core.sched: Sequence group 3 is preempted: not enough KV cache space",
        "ERROR megatron.core.optimizer: gradient all-reduce failed",
        "rollout engine: vLLM (cpu, infer TP 1)",
    ]
    assert proc.stderr == ""
    text = log.read_text()
    for line in (
        "a print from a library",
        "NUMA binding from C++",
        "RotaryEmbedding: Failed to load weights",
        "preempted",
        "gradient all-reduce failed",
        "rollout engine",
        "compatibility applied",
        "full scope is deprecated",
    ):
        assert line in text, line
    summary = library_logs.summary_line(str(log.parent))
    assert summary == f"library logs: {log.parent} (actor_0.log 5 warning(s) 1 error(s))"


def test_nothing_is_routed_without_a_log_file(monkeypatch):
    monkeypatch.delenv(library_logs.ENV_LOG_FILE, raising=False)
    assert library_logs.route_process_output() is None


def test_driver_routing_is_undone(tmp_path, capsys):
    root = logging.getLogger()
    before = list(root.handlers)
    undo = library_logs.route_driver_logs(str(tmp_path))
    logging.getLogger("ray._private.authentication").warning("Token authentication is enabled")
    logging.getLogger("ray.autoscaler").error("node died")
    undo()
    assert root.handlers == before
    err = capsys.readouterr().err
    # (the formatted lines: a handler Ray attached at import to a stream pytest has since closed may print its
    # "Logging error" report, message included, when the suite runs in another order)
    assert "ray._private.authentication: Token" not in err and "ERROR ray.autoscaler: node died" in err
    text = (tmp_path / "driver.log").read_text()
    assert "Token authentication is enabled" in text and "node died" in text
