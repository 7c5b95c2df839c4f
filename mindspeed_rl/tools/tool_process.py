"""The process one tool call runs in (``main``), inside bubblewrap or as
a plain child (``isolation.py``).

It reads one request (JSON on stdin: function, arguments, scratch folder, limits), imports the tool's module,
then, before the tool's code runs, closes itself in:
1. resource limits: CPU seconds, address space, file size, open files, threads (with isolation), no core;
2. the seccomp filter of ``syscall_filter.py``: no new processes or programs, nothing that reaches another
   process or the kernel's global state (skipped with a note where libseccomp is missing);
3. an audit hook (PEP 578) that answers writes outside the scratch folder, subprocesses, signals, sockets and
   ctypes with a readable error message. Code in this process can remove it: it is there for the model's
   sake (a clear message), the boundary is the two layers above and the namespaces around the process.

It answers on its original stdout, framed: one header line ``{"status": ..., "bytes": N}`` then N bytes of
UTF-8 content. What the tool prints goes to a file in the scratch folder. The parent (``sandbox.py``) trusts
none of it: it reads at most the result limit and validates the frame.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict

STATUSES = ("ok", "error", "timeout", "oversized", "crash")
HEADER_MAX = 256  # bytes of the header line, newline included
REQUEST_MAX = 64 << 20

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


def frame(content: str, status: str) -> bytes:
    """The answer as the parent reads it."""
    body = content.encode("utf-8", "replace")
    return json.dumps({"status": status, "bytes": len(body)}).encode() + b"\n" + body


def frame_length(data: bytes) -> int:
    """The length of the complete frame at the start of ``data`` (0: not complete yet, or not a frame)."""
    head, newline, _ = data.partition(b"\n")
    if not newline:
        return 0
    try:
        size = json.loads(head.decode("ascii"))["bytes"]
    except (UnicodeDecodeError, ValueError, TypeError, KeyError):
        return 0
    end = len(head) + 1 + size if type(size) is int and size >= 0 else 0
    return end if 0 < end <= len(data) else 0


def _inside(path: Any, scratch: str) -> bool:
    if isinstance(path, int):
        return True  # an already open descriptor
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == scratch or real.startswith(scratch + os.sep)


def _install_audit_hook(scratch: str) -> None:
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


def _set_limits(limits: Dict[str, Any], isolated: bool) -> None:
    import resource

    cpu = int(limits["cpu_seconds"])
    wanted = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits["memory_mb"] << 20,) * 2),
        (resource.RLIMIT_FSIZE, (limits["max_file_mb"] << 20,) * 2),
        (resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if isolated:  # counted per uid and user namespace: the call's own there; unisolated, every process of the user
        wanted.append((resource.RLIMIT_NPROC, (limits["max_threads"],) * 2))
    for which, value in wanted:
        resource.setrlimit(which, value)


def _read_request() -> Dict[str, Any]:
    data = sys.stdin.buffer.read(REQUEST_MAX + 1)
    if len(data) > REQUEST_MAX:
        raise ValueError(f"the request is larger than {REQUEST_MAX} bytes")
    return json.loads(data)


def main() -> int:
    answer_fd = os.dup(1)
    sent = False

    def reply(content: str, status: str) -> int:
        nonlocal sent
        if not sent:
            sent = True
            with os.fdopen(answer_fd, "wb") as fh:
                fh.write(frame(content, status))
        return 0

    try:
        request = _read_request()
        scratch = os.path.realpath(request["scratch"])
        limits = request["limits"]
        printed = os.open(os.path.join(scratch, "output.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(printed, 1)
        os.dup2(printed, 2)
        os.close(printed)
        from .registry import import_function
        from .syscall_filter import load as load_syscall_filter

        function = import_function(request["function"])  # before the limits: the tool's own imports are trusted
        _set_limits(limits, request["isolated"])
        try:
            load_syscall_filter()
        except OSError as exc:
            if request["isolated"]:
                print(f"sandbox: no seccomp filter ({exc.strerror or exc})", file=sys.stderr, flush=True)
        _install_audit_hook(scratch)
    except BaseException as exc:  # noqa: BLE001 - the set-up failed: the call is a crash, the run goes on
        return reply(f"Error: the tool could not start: {type(exc).__name__}: {exc}"[:2000], "crash")
    try:
        result = function(**request["arguments"])
        content = result if isinstance(result, str) else json.dumps(result, default=str)
    except MemoryError:
        return reply(f"Error: the tool ran out of memory (limit {limits['memory_mb']} MB)", "error")
    except BaseException as exc:  # the tool's failure is the model's information, never the run's end
        return reply(f"Error: {type(exc).__name__}: {exc}"[:2000], "error")
    size = len(content.encode("utf-8", "replace"))
    if size > limits["max_result_bytes"]:
        return reply(
            f"Error: the tool's result has {size} bytes, more than the limit of {limits['max_result_bytes']}",
            "oversized",
        )
    return reply(content, "ok")


if __name__ == "__main__":
    sys.exit(main())
