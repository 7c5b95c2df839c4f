"""The sandbox every tool call runs in: a fresh child process per call.

Limits of the child (``SandboxLimits``; the rollout's ``tool_*`` keys):
- wall-clock timeout (the process group is killed), CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS),
  the size of any file it writes (RLIMIT_FSIZE), no core dumps;
- no network: a new network namespace (only a loopback that is down) where unprivileged user namespaces are
  allowed, and everywhere an audit hook refusing socket connect/bind;
- no writes outside its scratch folder (a fresh temporary folder, the working directory, removed after the
  call), no subprocesses, no ctypes: an audit hook (PEP 578) refuses them;
- a result longer than ``max_result_bytes`` is refused (the model gets an error message); what the tool prints
  goes to a file in the scratch folder, not into the result.

It guards a training run against a model's mistakes (endless loops, memory blow-ups, stray files, huge
outputs); it is not a security boundary against a determined attacker. Run untrusted code at scale in a
container sandbox and call it from a tool.

Every failure becomes a ``ToolResult`` with a status (error, timeout, oversized, crash) and a message the
model reads; the run goes on.

The child side is this module's ``main`` (``python -m mindspeed_rl.tools.sandbox``): it reads one request
(JSON on stdin), applies the limits, runs the function and writes one JSON answer to the original stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

STATUSES = ("ok", "error", "timeout", "oversized", "crash")


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock per call
    cpu_seconds: int = 10  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS
    max_result_bytes: int = 65536  # longer results are refused
    max_file_mb: int = 64  # RLIMIT_FSIZE: any file the tool writes, its printed output included


@dataclass
class ToolResult:
    content: str  # what the model reads
    status: str  # one of STATUSES
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox:
    """Runs tool functions (``module:function`` paths) in child processes under ``limits``."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), scratch_root: Optional[str] = None):
        self.limits, self.scratch_root = limits, scratch_root
        if scratch_root:
            os.makedirs(scratch_root, exist_ok=True)
        # the child finds mindspeed_rl and the tools' modules where the driver does
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
        }

    def run(self, function: str, arguments: Dict[str, Any]) -> ToolResult:
        scratch = tempfile.mkdtemp(prefix="tool-", dir=self.scratch_root)
        request = json.dumps(
            {"function": function, "arguments": arguments, "scratch": scratch, "limits": asdict(self.limits)}
        )
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mindspeed_rl.tools.sandbox"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=scratch,
                env={**self.env, "HOME": scratch, "TMPDIR": scratch},
                start_new_session=True,
            )
            try:
                out, _ = proc.communicate(request.encode(), timeout=self.limits.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return ToolResult(
                    f"Error: the tool did not finish within {self.limits.timeout_s:g} s",
                    "timeout",
                    time.perf_counter() - start,
                )
            seconds = time.perf_counter() - start
            return _answer(out, proc.returncode, self.limits, seconds)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def run_many(self, calls: Sequence[Tuple[str, Dict[str, Any]]], parallel: int = 2) -> List[ToolResult]:
        """Several calls, ``parallel`` child processes at a time, results in order."""
        if not calls:
            return []
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            return list(pool.map(lambda call: self.run(*call), calls))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def _answer(out: bytes, returncode: int, limits: SandboxLimits, seconds: float) -> ToolResult:
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):  # RLIMIT_CPU: SIGXCPU at the soft, SIGKILL at the hard
        return ToolResult(f"Error: the tool used more than {limits.cpu_seconds} s of CPU time", "timeout", seconds)
    try:
        answer = json.loads(out.decode("utf-8"))
        return ToolResult(
            str(answer["content"]), answer["status"] if answer["status"] in STATUSES else "crash", seconds
        )
    except (ValueError, KeyError, TypeError):
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        return ToolResult(f"Error: the tool process died ({how})", "crash", seconds)


# ----- the child process ------------------------------------------------------------------------------------
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_REFUSED_EVENTS = (
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
    "ctypes.dlopen",
    "ctypes.cdata",
    "ctypes.call_function",
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.getaddrinfo",
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "os.chdir",
    "sys.addaudithook",
)
_PATH_EVENTS = (
    "os.remove",
    "os.rmdir",
    "os.mkdir",
    "os.rename",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.chmod",
    "os.chown",
    "os.utime",
    "shutil.rmtree",
    "shutil.copyfile",
    "shutil.move",
)


def _inside(path: Any, scratch: str) -> bool:
    if isinstance(path, int):
        return True  # an already open descriptor
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == scratch or real.startswith(scratch + os.sep)


def _install_guard(scratch: str) -> None:
    def guard(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and not _inside(path, scratch):
                raise PermissionError(f"sandbox: writing outside the scratch folder is not allowed: {path}")
        elif event.startswith(_REFUSED_EVENTS):
            raise PermissionError(f"sandbox: {event} is not allowed")
        elif event in _PATH_EVENTS and not all(
            _inside(a, scratch) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))
        ):
            raise PermissionError(f"sandbox: {event} outside the scratch folder is not allowed")

    sys.addaudithook(guard)


def _isolate_network() -> str:
    """A network namespace of its own (unprivileged user namespaces); 'audit hook' where not allowed."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x10000000 | 0x40000000) == 0:  # CLONE_NEWUSER | CLONE_NEWNET
            return "namespace"
    except (OSError, AttributeError):
        pass
    return "audit hook"


def _set_limits(limits: Dict[str, Any]) -> None:
    import resource

    cpu = int(limits["cpu_seconds"])
    for which, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits["memory_mb"] << 20,) * 2),
        (resource.RLIMIT_FSIZE, (limits["max_file_mb"] << 20,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)


def main() -> int:
    request = json.loads(sys.stdin.read())
    answer_fd = os.dup(1)  # the answer's channel; what the tool prints goes to a scratch file
    scratch = os.path.realpath(request["scratch"])
    printed = os.open(os.path.join(scratch, "output.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(printed, 1)
    os.dup2(printed, 2)
    limits = request["limits"]

    def reply(content: str, status: str) -> int:
        data = json.dumps({"content": content, "status": status}).encode()
        with os.fdopen(answer_fd, "wb") as fh:
            fh.write(data)
        return 0

    try:
        from .registry import import_function

        function = import_function(request["function"])  # imported before the guard: modules may open files
        _isolate_network()
        _set_limits(limits)
        _install_guard(scratch)
        result = function(**request["arguments"])
        content = result if isinstance(result, str) else json.dumps(result, default=str)
    except MemoryError:
        return reply(f"Error: the tool ran out of memory (limit {limits['memory_mb']} MB)", "error")
    except BaseException as exc:  # the tool's failure is the model's information, never the run's end
        return reply(f"Error: {type(exc).__name__}: {exc}"[:2000], "error")
    size = len(content.encode("utf-8"))
    if size > limits["max_result_bytes"]:
        return reply(
            f"Error: the tool's result has {size} bytes, more than the limit of {limits['max_result_bytes']}",
            "oversized",
        )
    return reply(content, "ok")


if __name__ == "__main__":
    sys.exit(main())
