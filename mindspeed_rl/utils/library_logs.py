"""Where library output goes.

With ``rl_config.library_logs: file`` (the default) every line that vLLM, Ray, megatron-core, torch or a
C extension writes in a worker process lands in ``<run_dir>/logs/<role>_<rank>.log``, and the driver's Ray
records in ``<run_dir>/logs/driver.log``. The console keeps our own messages and the library records that
matter to the user: errors, and warnings that change results or speed (``MATTERS``). Nothing is dropped:
the file has every line, and the end of a run prints how many warnings and errors each file holds.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Callable, Dict, List, Optional, TextIO

# Library warnings worth a console line: memory pressure, requests cut short, numerics, lost work.
MATTERS = re.compile(
    "|".join(
        [
            r"out of memory",
            r"\bOOM\b",
            r"preempt",
            r"insufficient",
            r"not enough (memory|KV)",
            r"exceed",
            r"truncat",
            r"\bnan\b",
            r"\binf\b",
            r"not finite",
            r"overflow",
            r"died",
            r"killed",
            r"timed? ?out",
        ]
    ),
    re.IGNORECASE,
)

FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ENV_LOG_FILE = "MINDSPEED_RL_LOG_FILE"  # set per worker by the launcher


class ConsoleFilter(logging.Filter):
    """Our own records at WARNING and above (INFO goes to the file only); library records at ERROR and above,
    or WARNING when they match ``MATTERS``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "mindspeed_rl" or record.name.startswith("mindspeed_rl."):
            return record.levelno >= logging.WARNING
        if record.levelno >= logging.ERROR:
            return True
        return record.levelno >= logging.WARNING and bool(MATTERS.search(record.getMessage()))


class _ConsoleFormatter(logging.Formatter):
    """Our messages as they are; a library's with its level and logger name, so the source is clear."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == "mindspeed_rl" or record.name.startswith("mindspeed_rl."):
            return message
        return f"{record.levelname} {record.name}: {message}"


def console_handler(stream: TextIO) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.addFilter(ConsoleFilter())
    handler.setFormatter(_ConsoleFormatter())
    return handler


def file_handler(path: str) -> logging.Handler:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    return handler


def route_process_output(log_path: Optional[str] = None) -> Optional[str]:
    """In a worker process: point file descriptors 1 and 2 at ``log_path`` (so C++ warnings and prints
    land there too), stop vLLM from installing its own stdout handler, and send every Python log record
    to the file and the ones that matter to the original stdout (which Ray forwards to the driver's console).
    Call it before vLLM or megatron are imported. Returns the path, or None when nothing was routed."""
    log_path = log_path or os.environ.get(ENV_LOG_FILE)
    if not log_path:
        return None
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"  # vLLM's records propagate to the root logger below
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    to_file = logging.StreamHandler(sys.stderr)  # fd 2 is the file now
    to_file.setFormatter(logging.Formatter(FILE_FORMAT))
    root.addHandler(to_file)
    root.addHandler(console_handler(console))
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    return log_path


def route_driver_logs(log_dir: str) -> Callable[[], None]:
    """In the driver: Python log records (Ray's included) to ``log_dir/driver.log``, those that matter to
    the console. Call before ``ray.init(configure_logging=False)`` (which clears the "ray" logger's handlers;
    its records then propagate here). Returns the undo, for a driver that runs several trainings."""
    root, ray_logger = logging.getLogger(), logging.getLogger("ray")
    handlers = [file_handler(os.path.join(log_dir, "driver.log")), console_handler(sys.stderr)]
    saved = (root.level, ray_logger.propagate)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    ray_logger.propagate = True

    def undo() -> None:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(saved[0])
        ray_logger.propagate = saved[1]

    return undo


LEVEL_WORDS = {"warning": re.compile(r"\bWARN(ING)?\b|\bWarning:"), "error": re.compile(r"\bERROR\b|\bError:")}


def summarize(log_dir: str) -> List[Dict[str, object]]:
    """Per log file: its path, line count, and the lines that say WARNING / ERROR."""
    if not os.path.isdir(log_dir):
        return []
    rows = []
    for name in sorted(os.listdir(log_dir)):
        if not name.endswith(".log"):
            continue
        path = os.path.join(log_dir, name)
        counts = {"lines": 0, "warning": 0, "error": 0}
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                counts["lines"] += 1
                for word, pattern in LEVEL_WORDS.items():
                    counts[word] += bool(pattern.search(line))
        rows.append({"file": path, **counts})
    return rows


def summary_line(log_dir: str) -> Optional[str]:
    """library logs: <dir> (actor_0.log 35 warnings, critic_0.log 2 warnings 1 error)"""
    rows = summarize(log_dir)
    if not rows:
        return None
    parts = []
    for row in rows:
        text = f"{os.path.basename(row['file'])} {row['warning']} warning(s)"
        if row["error"]:
            text += f" {row['error']} error(s)"
        parts.append(text)
    return f"library logs: {log_dir} ({', '.join(parts)})"
