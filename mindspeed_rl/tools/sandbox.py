"""The sandbox every tool call runs in: a fresh process per call (``tool_process.py``), isolated by bubblewrap
(``isolation.py``) unless the config says otherwise, under ``SandboxLimits`` (the rollout's ``tool_*`` keys):

- wall-clock timeout (the call's processes are killed), CPU seconds, address space, file size, open files,
  threads; no new processes or programs (seccomp); a RAM scratch folder of ``scratch_mb``;
- an answer of at most ``max_result_bytes``: the parent reads no more than that (plus a short header) from
  the child, so a tool that writes gigabytes costs the driver nothing, and takes an answer only when its
  frame, status and UTF-8 text are valid.

Every failure becomes a ``ToolResult`` with a status (error, timeout, oversized, crash) and a message the
model reads; the run goes on.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .isolation import CODE_ROOT, SCRATCH, NoFreeUid, bwrap_prefix, call_uid, code_mounts, drop_privileges, require
from .tool_process import HEADER_MAX, STATUSES, frame_length

CHILD = "import sys; from mindspeed_rl.tools.tool_process import main; sys.exit(main())"
STDERR_KEPT = 4096  # bytes of the child's stderr kept for the run's logs (ToolResult.detail)
# beyond the call timeout, how long a root driver's call waits for a uid to free: a running call ends within its
# timeout and the second _exchange gives it before killing
UID_WAIT_S = 2.0


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock per call
    cpu_seconds: int = 10  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS
    max_result_bytes: int = 65536  # longer results are refused
    max_file_mb: int = 64  # RLIMIT_FSIZE: any one file the tool writes
    scratch_mb: int = 64  # the scratch folder's size (a RAM file system inside bubblewrap)
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_threads: int = 32  # RLIMIT_NPROC inside bubblewrap (no process can be started at all)


@dataclass
class ToolResult:
    content: str  # what the model reads
    status: str  # one of STATUSES
    seconds: float = 0.0
    detail: str = ""  # what the child process said on stderr, for the run's logs; never shown to the model

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox:
    """Runs tool functions (``module:function`` paths) in isolated child processes under ``limits``.

    ``isolation``: ``bwrap`` (refused with IsolationUnavailable where bubblewrap cannot run) or ``none`` (a
    plain child process in a temporary folder under ``scratch_root``)."""

    def __init__(
        self, limits: SandboxLimits = SandboxLimits(), isolation: str = "bwrap", scratch_root: Optional[str] = None
    ):
        require(isolation)
        self.limits, self.isolation, self.scratch_root = limits, isolation, scratch_root
        if scratch_root:
            os.makedirs(scratch_root, exist_ok=True)
        self._prefixes: Dict[str, List[str]] = {}  # the bubblewrap part of the command line, per function

    def _command(self, function: str, scratch: str, uid: Optional[int]) -> Tuple[List[str], Dict[str, str]]:
        """(argv, environment) of the call's process (``uid``: its own under a root driver, else None)."""
        env = {
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "HOME": scratch,
            "TMPDIR": scratch,
        }
        argv = [sys.executable, "-s", "-c", CHILD]
        if self.isolation == "none":
            env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
            return argv, env
        if function not in self._prefixes:  # the same for every call of the function: built once
            env.update(PATH="/usr/bin:/bin", PYTHONPATH=CODE_ROOT)
            self._prefixes[function] = bwrap_prefix(code_mounts([function]), env, self.limits.scratch_mb)
        return self._prefixes[function] + drop_privileges(argv, uid), {}

    def run(self, function: str, arguments: Dict[str, Any]) -> ToolResult:
        if self.isolation == "none":
            return self._call(function, arguments, None)
        try:  # a root driver's call holds a uid of its own until its bubblewrap has exited
            with call_uid(self.limits.timeout_s + UID_WAIT_S) as uid:
                return self._call(function, arguments, uid)
        except NoFreeUid as exc:
            busy = "Error: the tool could not start: too many tool calls are running"
            return ToolResult(busy, "crash", 0.0, str(exc))

    def _call(self, function: str, arguments: Dict[str, Any], uid: Optional[int]) -> ToolResult:
        isolated = self.isolation == "bwrap"
        scratch = SCRATCH if isolated else tempfile.mkdtemp(prefix="tool-", dir=self.scratch_root)
        request = json.dumps(
            {
                "function": function,
                "arguments": arguments,
                "scratch": scratch,
                "limits": asdict(self.limits),
                "isolated": isolated,
            }
        ).encode()
        argv, env = self._command(function, scratch, uid)
        start = time.perf_counter()
        try:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd="/" if isolated else scratch,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:  # e.g. bwrap removed under the run: the call fails, the run goes on
                return ToolResult("Error: the tool process could not start", "crash", 0.0, str(exc))
            cap = HEADER_MAX + self.limits.max_result_bytes + 1
            out, err, timed_out, killed = _exchange(proc, request, cap, self.limits.timeout_s)
            seconds = time.perf_counter() - start
            detail = err.decode("utf-8", "replace")
            if timed_out:
                return ToolResult(
                    f"Error: the tool did not finish within {self.limits.timeout_s:g} s", "timeout", seconds, detail
                )
            if len(out) >= cap:
                return ToolResult(
                    f"Error: the tool's answer is longer than the limit of {self.limits.max_result_bytes} bytes",
                    "oversized",
                    seconds,
                    detail,
                )
            # a process killed here after closing its output did not die of a limit: only its answer counts
            result = answer(out, 0 if killed else proc.returncode, self.limits, isolated)
            result.seconds, result.detail = seconds, detail
            return result
        finally:
            if not isolated:
                shutil.rmtree(scratch, ignore_errors=True)

    def run_many(self, calls: Sequence[Tuple[str, Dict[str, Any]]], parallel: int = 2) -> List[ToolResult]:
        """Several calls, ``parallel`` child processes at a time, results in order."""
        if not calls:
            return []
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            return list(pool.map(lambda call: self.run(*call), calls))


def _exchange(proc: subprocess.Popen, request: bytes, cap: int, timeout: float) -> Tuple[bytes, bytes, bool, bool]:
    """Send ``request``, read at most ``cap`` bytes of stdout and STDERR_KEPT of stderr, until the process
    closes both, a whole answer frame is in, the cap is reached, or ``timeout`` passes; the process (group)
    is killed unless it exits within a second of that. Returns (stdout, stderr, timed out, killed here)."""
    deadline = time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    pending = memoryview(request)
    timed_out = False
    os.set_blocking(proc.stdin.fileno(), False)
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdin, selectors.EVENT_WRITE)
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        open_reads = 2
        while open_reads:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                if key.fileobj is proc.stdin:
                    try:
                        written = os.write(proc.stdin.fileno(), pending[:65536])
                        pending = pending[written:]
                    except BlockingIOError:
                        continue
                    except OSError:  # the child is gone or closed its stdin
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                into, limit = (out, cap) if key.fileobj is proc.stdout else (err, STDERR_KEPT)
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_reads -= 1
                    continue
                if key.fileobj is proc.stderr:
                    into += chunk[: max(0, limit - len(into))]
                    continue
                into += chunk[: limit - len(into)]
                if len(into) >= limit or frame_length(into):  # over the limit, or a whole answer is in
                    open_reads = 0
                    break
    if proc.poll() is None:
        try:
            proc.wait(timeout=0 if (timed_out or len(out) >= cap) else 1.0)
        except subprocess.TimeoutExpired:
            pass
    killed = proc.poll() is None
    if killed:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if not stream.closed:
            stream.close()
    return bytes(out), bytes(err), timed_out, killed


def answer(out: bytes, returncode: int, limits: SandboxLimits, isolated: bool = False) -> ToolResult:
    """The child's framed answer (``tool_process.frame``) as a result, or a crash result saying what is wrong
    with it: nothing the child sends is taken unchecked."""
    # bubblewrap exits with 128 + the signal that ended the process it ran
    died_of = -returncode if returncode < 0 else returncode - 128 if isolated and returncode > 128 else 0
    if died_of in (signal.SIGXCPU, signal.SIGKILL):  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard
        return ToolResult(f"Error: the tool used more than {limits.cpu_seconds} s of CPU time", "timeout")
    head, newline, body = out.partition(b"\n")
    problem = None
    if not newline or len(head) >= HEADER_MAX:
        problem = "no answer"
    else:
        try:
            header = json.loads(head.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            header = None
        if not isinstance(header, dict) or set(header) != {"status", "bytes"}:
            problem = "a malformed answer"
        elif header["status"] not in STATUSES or type(header["bytes"]) is not int or header["bytes"] != len(body):
            problem = "a malformed answer"
        elif len(body) > limits.max_result_bytes:
            return ToolResult(
                f"Error: the tool's result has {len(body)} bytes, more than the limit of {limits.max_result_bytes}",
                "oversized",
            )
        else:
            try:
                return ToolResult(body.decode("utf-8"), header["status"])
            except UnicodeDecodeError:
                problem = "an answer that is not valid UTF-8 text"
    if problem == "no answer":
        how = f"signal {died_of}" if died_of else f"exit code {returncode}"
        return ToolResult(f"Error: the tool process died ({how})", "crash")
    return ToolResult(f"Error: the tool process sent {problem}", "crash")
