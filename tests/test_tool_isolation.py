"""Model-written code against the tool boundary: each escape a hostile probe found with plain Python in the
``python`` tool, tried again from the tool. Under bubblewrap each must fail and leave the driver's files,
process and limits as they were; the answer checks of the parent and the parser's bounds hold under any
isolation. Tests that need bubblewrap say why they skip where it cannot run."""

import json
import os
import resource
import signal
import sys
import textwrap
import time
import tracemalloc

import pytest

from mindspeed_rl.tools import Sandbox, SandboxLimits, parse_hermes
from mindspeed_rl.tools.isolation import IsolationUnavailable, bwrap_unavailable, choose
from mindspeed_rl.tools.sandbox import answer
from mindspeed_rl.tools.tool_process import frame

LIMITS = SandboxLimits(timeout_s=6.0, cpu_seconds=3, memory_mb=512, max_result_bytes=4096, max_file_mb=8)
PYTHON_TOOL = "mindspeed_rl.tools.builtin:python"
needs_bwrap = pytest.mark.skipif(
    bool(bwrap_unavailable()), reason=f"bubblewrap cannot run on this machine: {bwrap_unavailable()}"
)


@pytest.fixture(scope="module")
def bwrap():
    if bwrap_unavailable():
        pytest.skip(f"bubblewrap cannot run on this machine: {bwrap_unavailable()}")
    return Sandbox(LIMITS, "bwrap")


@pytest.fixture
def victim(tmp_path):
    """Another run's checkpoint folder, as the driver sees it."""
    folder = tmp_path / "ckpt"
    (folder / "iter_0000005").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("5")
    return folder


# what hostile code does first: empty the in-process audit hook's refusal list and make its path check say yes,
# so that only the OS boundary is left to test
UNHOOK = (
    "import mindspeed_rl.tools.tool_process as child\n"
    "child._REFUSED_EVENTS = (); child._PATH_EVENTS = (); child._inside = lambda *a: True\n"
)


def program(sandbox, code: str, **names) -> str:
    result = sandbox.run(PYTHON_TOOL, {"code": UNHOOK + textwrap.dedent(code).format(**names)})
    assert result.status == "ok", (result.status, result.content, result.detail)
    print(result.content)  # what the program saw, for pytest -s
    return result.content


def untouched(folder) -> bool:
    names = sorted(p.name for p in folder.iterdir())
    return names == ["iter_0000005", "latest_checkpointed_iteration.txt"] and (
        (folder / "latest_checkpointed_iteration.txt").read_text() == "5"
    )


# ----- files -------------------------------------------------------------------------------------------------
@needs_bwrap
def test_no_write_reaches_the_drivers_files_by_dir_fd_or_patched_paths(bwrap, victim):
    out = program(
        bwrap,
        """
        import os
        tried = []
        def attempt(what, fn):
            try:
                fn()
                tried.append(what + ": done")
            except OSError as exc:
                tried.append(what + ": " + type(exc).__name__)
        folder = {folder!r}
        attempt("dir fd", lambda: os.open(folder, os.O_RDONLY))
        def by_dir_fd():
            fd = os.open(folder, os.O_RDONLY)
            out = os.open("latest_checkpointed_iteration.txt", os.O_WRONLY | os.O_TRUNC, dir_fd=fd)
            os.write(out, b"999")
        attempt("write", by_dir_fd)
        attempt("unlink", lambda: os.unlink(folder + "/latest_checkpointed_iteration.txt"))
        attempt("mkfifo", lambda: os.mkfifo(folder + "/fifo"))
        attempt("setxattr", lambda: os.setxattr(folder, "user.x", b"1"))
        os.path.realpath = lambda path, **kw: "/scratch/ok"
        attempt("patched realpath", lambda: open(folder + "/latest_checkpointed_iteration.txt", "w").write("999"))
        print("|".join(tried))
        """,
        folder=str(victim),
    )
    assert "done" not in out and out.count("Error") == 6, out
    assert untouched(victim)


@needs_bwrap
def test_no_module_can_be_planted_on_the_drivers_import_path(bwrap, tmp_path, monkeypatch):
    planted = tmp_path / "on_path"
    planted.mkdir()
    monkeypatch.syspath_prepend(str(planted))
    targets = [str(planted)] + [p for p in sys.path if p and os.path.isdir(p)]
    out = program(
        bwrap,
        """
        import os
        for folder in {targets!r}:
            try:
                with open(os.path.join(folder, "sitecustomize_planted.py"), "w") as fh:
                    fh.write("import os; os._exit(99)")
                print("planted", folder)
            except OSError as exc:
                pass
        import mindspeed_rl.tools, sys
        print("seen", os.path.dirname(mindspeed_rl.tools.__file__), sys.path)
        """,
        targets=targets,
    )
    assert "planted" not in out, out
    assert not any(os.path.exists(os.path.join(t, "sitecustomize_planted.py")) for t in targets)
    assert "seen /sandbox/code/mindspeed_rl/tools" in out  # the tools' code is a read-only copy of its own


@needs_bwrap
def test_the_drivers_files_cannot_be_read(bwrap, victim):
    home = os.path.expanduser("~")
    out = program(
        bwrap,
        """
        import json, os
        seen = {{}}
        for path in ("/etc/passwd", {ckpt!r}, {home!r}):
            try:
                seen[path] = os.listdir(path) if os.path.isdir(path) else open(path).read()[:20]
            except OSError as exc:
                seen[path] = type(exc).__name__
        seen["/"] = sorted(os.listdir("/"))
        for top in ("home", "tmp", "var", "opt", "mnt"):
            if top in seen["/"]:
                seen["/" + top] = sorted(os.listdir("/" + top))
        print(json.dumps(seen))
        """,
        ckpt=str(victim / "latest_checkpointed_iteration.txt"),
        home=home,
    )
    seen = json.loads(out)
    assert seen["/etc/passwd"] == "FileNotFoundError" and seen[str(victim / "latest_checkpointed_iteration.txt")] == (
        "FileNotFoundError"
    )
    # of the home folder only the way to an interpreter bound read-only (e.g. ~/.pyenv) can exist
    interpreter = {
        os.path.relpath(p, home).split(os.sep)[0] for p in (sys.base_prefix, sys.prefix) if p.startswith(home)
    }
    assert seen[home] == "FileNotFoundError" or set(seen[home]) <= interpreter, seen
    # a top folder is there only on the way to the interpreter or virtualenv bound read-only (a clone under /tmp),
    # and holds nothing but that way
    ways = {}
    for bound in (sys.base_prefix, sys.prefix):
        parts = os.path.abspath(bound).split(os.sep)
        ways.setdefault(parts[1], set()).add(parts[2] if len(parts) > 2 else "")
    for top in {"home", "tmp", "var", "opt", "mnt"} & set(seen["/"]):
        assert top in ways and set(seen["/" + top]) <= ways[top], seen


@needs_bwrap
def test_the_scratch_folder_is_small_and_everything_else_read_only(bwrap):
    out = program(
        bwrap,
        """
        import os
        import errno, os
        for path in ("/x", "/dev/shm/x", "/sandbox/code/x", "/usr/x", "/proc/x"):
            try:
                open(path, "w").write("x")
                print(path, "written")
            except OSError as exc:
                print(path, errno.errorcode.get(exc.errno))
        written = 0
        try:
            for i in range(100):  # files of 4 MB (each under the 8 MB file-size limit)
                with open(f"/scratch/fill{{i}}", "wb") as fh:
                    for _ in range(4):
                        fh.write(b"x" * (1 << 20))
                        written += 1
        except OSError as exc:
            print("scratch full at", written, "MB", errno.errorcode.get(exc.errno))
        """,
    )
    assert "written" not in out and "None" not in out, out
    assert "scratch full at" in out and "ENOSPC" in out and int(out.split("full at ")[1].split()[0]) <= 64


# ----- the kernel's global state (a root driver is how training containers run) --------------------------------
def _host_ids_of_calls(stop) -> set:
    """(real uid, effective uid, real gid, effective gid) of every tool-call interpreter seen from the host until
    ``stop`` is set: the call's own process (argv[0] the interpreter), not the bubblewrap or setpriv around it."""
    from mindspeed_rl.tools.sandbox import CHILD

    seen = set()
    while not stop.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
                if argv[0] != sys.executable.encode() or CHILD.encode() not in argv:
                    continue
                with open(f"/proc/{pid}/status") as fh:
                    fields = dict(line.split(":", 1) for line in fh if ":" in line)
                if not _descends_from_this_process(int(fields["PPid"])):
                    continue  # a call of another test running beside this one
            except OSError:
                continue
            uids, gids = fields["Uid"].split(), fields["Gid"].split()
            seen.add((int(uids[0]), int(uids[1]), int(gids[0]), int(gids[1])))
        time.sleep(0.02)
    return seen


def _descends_from_this_process(pid: int) -> bool:
    while pid > 1:
        if pid == os.getpid():
            return True
        with open(f"/proc/{pid}/status") as fh:
            pid = int(next(line for line in fh if line.startswith("PPid:")).split()[1])
    return False


@needs_bwrap
def test_the_call_never_runs_as_host_root(bwrap):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from mindspeed_rl.tools.isolation import UID_BASE

    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        watched = pool.submit(_host_ids_of_calls, stop)
        out = program(bwrap, "import os, time; time.sleep(1.5); print(os.getuid(), os.getgroups())")
        stop.set()
        ids = watched.result()
    assert ids, "the call's process was not seen from the host"
    assert all(0 not in four for four in ids), ids  # host uid and gid 0 never
    if os.geteuid() == 0:  # a uid of the call's own, no supplementary groups
        assert all(four[0] >= UID_BASE and len(set(four)) == 1 for four in ids), ids
        assert out.split()[0] == str(next(iter(ids))[0]) and "[]" in out, out
    else:
        assert all(four[0] == os.geteuid() for four in ids), ids  # the driver's own uid behind the namespace


class _HeldCalls:
    """Tool-call processes of a root driver that run until released: each records the uid setpriv gives it."""

    def __init__(self, monkeypatch):
        import threading

        from mindspeed_rl.tools import isolation, sandbox

        self.lock, self.running, self.clashes, self.release = threading.Lock(), {}, [], threading.Event()
        monkeypatch.setattr(isolation, "as_root", lambda: True)
        monkeypatch.setattr(sandbox, "require", lambda isolation: None)
        monkeypatch.setattr(sandbox.subprocess, "Popen", self.start)
        monkeypatch.setattr(sandbox, "_exchange", self.exchange)

    def start(self, argv, **_):
        uid = int(argv[argv.index("--reuid") + 1])
        with self.lock:
            if uid in self.running.values():
                self.clashes.append(uid)
            proc = type("Proc", (), {"returncode": 0, "pid": 0})()
            self.running[id(proc)] = uid
        return proc

    def exchange(self, proc, request, cap, timeout):
        self.release.wait(30)
        with self.lock:
            del self.running[id(proc)]
        return frame("done", "ok"), b"", False, False


def test_a_running_calls_uid_is_never_given_to_another_call(monkeypatch):
    """Before the fix the uid was a counter modulo 64: the 65th call shared the 1st's uid (and thread limit)
    while both ran."""
    import threading

    UID_SLOTS = 64  # isolation.UID_SLOTS: the uids of one driver process
    held = _HeldCalls(monkeypatch)
    sandbox = Sandbox(SandboxLimits(timeout_s=0.5), "bwrap")
    results = []

    def start(count: int) -> list:
        calls = [threading.Thread(target=lambda: results.append(sandbox.run(PYTHON_TOOL, {}))) for _ in range(count)]
        for call in calls:
            call.start()
        return calls

    try:
        first = start(UID_SLOTS)
        while len(held.running) < UID_SLOTS:
            time.sleep(0.01)
        more = start(UID_SLOTS)  # they wait for a free uid: none comes within the timeout + UID_WAIT_S
        time.sleep(0.5)
        assert len(held.running) == UID_SLOTS and not held.clashes, held.clashes
        for call in more:
            call.join()
    finally:
        held.release.set()
    refused = [r for r in results if r.status == "crash"]
    assert len(refused) == UID_SLOTS, [r.status for r in results]
    assert refused[0].content == "Error: the tool could not start: too many tool calls are running", refused[0]
    assert "all 64 tool-call uids of this process are held by running calls" in refused[0].detail
    for call in first + start(8):  # the uids are free again once their calls ended
        call.join()
    assert not held.clashes and [r.status for r in results].count("ok") == UID_SLOTS + 8


@needs_bwrap
def test_no_proc_sys_file_or_host_control_file_opens_for_writing(bwrap):
    """The attack of the report: the audit hook switched off, then /proc/sys written (core_pattern is a way from
    a container to root code on the host); with a root driver this opened on the code before the fix."""
    out = program(
        bwrap,
        """
        import os
        opened, tried = [], 0
        targets = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/vm/stat_interval",
                   "/proc/sysrq-trigger", "/proc/sys/kernel/new", "/proc/irq/default_smp_affinity", "/proc/mtrr"]
        for top, _, files in os.walk("/proc/sys"):
            targets += [os.path.join(top, name) for name in files]
        for path in targets:
            for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_CREAT):
                tried += 1
                try:
                    os.close(os.open(path, flags))
                    opened.append(path)
                except OSError:
                    pass
        print("tried", tried, "opened", sorted(set(opened)))
        print("sys", os.path.exists("/sys") and os.listdir("/sys"))
        """,
    )
    assert "opened []" in out and "sys False" in out, out


@needs_bwrap
def test_the_thread_limit_holds(bwrap):
    out = program(
        bwrap,
        """
        import threading, time
        threading.stack_size(1 << 16)  # small stacks: the address-space limit is not what stops them
        started = 0
        try:
            for _ in range({many}):
                threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
                started += 1
        except RuntimeError as exc:
            print("refused:", exc)
        print("started", started)
        """,
        many=4 * LIMITS.max_threads,
    )
    assert "refused" in out and int(out.split("started ")[1].split()[0]) < LIMITS.max_threads, out


# ----- processes ---------------------------------------------------------------------------------------------
@needs_bwrap
def test_no_process_starts_even_with_the_audit_hook_switched_off(bwrap, tmp_path):
    marker = tmp_path / "ran"
    out = program(
        bwrap,
        """
        import os, subprocess
        print("system", os.system("echo hi > /scratch/m; echo hi > {marker}"))
        try:
            subprocess.run(["/bin/sh", "-c", "echo hi > /scratch/m"])
            print("popen ran")
        except OSError as exc:
            print("popen", type(exc).__name__)
        try:
            pid = os.fork()
            if pid == 0:
                os.setsid()
                os._exit(0)
            print("forked")
        except OSError as exc:
            print("fork", type(exc).__name__)
        print("marker", os.path.exists("/scratch/m"))
        """,
        marker=str(marker),
    )
    assert "marker False" in out and "forked" not in out and "popen ran" not in out, out
    assert not marker.exists()


@needs_bwrap
def test_the_driver_can_be_neither_signalled_nor_limited(bwrap):
    me, before = os.getpid(), resource.getrlimit(resource.RLIMIT_NOFILE)
    out = program(
        bwrap,
        """
        import os, resource, signal
        print("parent", os.getppid())
        for pid in ({driver}, os.getppid()):
            try:
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, 3))
                print("limited", pid)
            except OSError as exc:
                print("prlimit", pid, type(exc).__name__)
        try:
            signal.pidfd_send_signal(os.pidfd_open({driver}), signal.SIGKILL)
            print("signalled the driver")
        except OSError as exc:
            print("pidfd", type(exc).__name__)
        try:
            os.kill({driver}, signal.SIGKILL)
            print("killed the driver")
        except OSError as exc:
            print("kill", type(exc).__name__)
        """,
        driver=me,
    )
    assert "limited" not in out and "signalled" not in out and "killed" not in out, out
    assert "parent 1" in out  # its own PID namespace: the driver does not exist there
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == before
    # a tool that kills what it sees as its parent only ends its own call
    ended = bwrap.run(PYTHON_TOOL, {"code": "import os, signal; os.kill(os.getppid(), signal.SIGKILL)"})
    assert ended.status in ("ok", "crash")


@needs_bwrap
def test_no_network(bwrap):
    import socket

    with socket.socket() as server:  # a service of the driver's host on loopback
        server.bind(("127.0.0.1", 0))
        server.listen()
        out = program(
            bwrap,
            """
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1)
                print("connected")
            except OSError as exc:
                print("refused", type(exc).__name__)
            """,
            port=server.getsockname()[1],
        )
    assert "refused" in out, out


@needs_bwrap
def test_no_vsock_socket_opens(bwrap):
    """vsock is outside every network namespace: from a VM's guest it reaches the host. Before the fix the
    socket opened in the sandbox (on a host without vsock it fails with EAFNOSUPPORT, not EPERM); a raw syscall
    with the family's upper 32 bits set is refused too (the kernel reads an int)."""
    out = program(
        bwrap,
        """
        import ctypes, errno, socket
        from mindspeed_rl.tools.syscall_filter import _library
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
            try:
                socket.socket(socket.AF_VSOCK, kind).close()
                print("opened", kind)
            except OSError as exc:
                print("socket", kind, errno.errorcode[exc.errno])
        try:
            socket.socketpair(socket.AF_VSOCK)
            print("opened a pair")
        except OSError as exc:
            print("socketpair", errno.errorcode[exc.errno])
        libc = ctypes.CDLL(None, use_errno=True)
        number = _library()[0].seccomp_syscall_resolve_name(b"socket")
        fd = libc.syscall(ctypes.c_long(number), ctypes.c_long(socket.AF_VSOCK | 1 << 32), ctypes.c_long(1), 0)
        print("raw", fd, errno.errorcode.get(ctypes.get_errno()))
        """,
    )
    lines = out.strip().splitlines()
    assert lines[:4] == ["socket 1 EPERM", "socket 2 EPERM", "socket 5 EPERM", "socketpair EPERM"], out
    assert lines[4] == "raw -1 EPERM", out


# ----- the answer --------------------------------------------------------------------------------------------
FLOOD = """
import os, stat
for fd in range(3, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            chunk = b"x" * (1 << 20)
            for _ in range(300):
                os.write(fd, chunk)
    except OSError:
        pass
"""
FORGED = """
import os, stat
for fd in range(3, 64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, {frame!r})
    except OSError:
        pass
os._exit(0)
"""


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
def test_the_parent_reads_no_more_than_the_limit_and_trusts_no_forged_answer(isolation, tmp_path):
    if isolation == "bwrap" and bwrap_unavailable():
        pytest.skip(f"bubblewrap cannot run on this machine: {bwrap_unavailable()}")
    sandbox = Sandbox(LIMITS, isolation, scratch_root=str(tmp_path))
    tracemalloc.start()
    start = time.perf_counter()
    flood = sandbox.run(PYTHON_TOOL, {"code": FLOOD})  # 300 MB at the answer's pipe
    seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert flood.status == "oversized" and "4096 bytes" in flood.content, flood
    assert peak < 2 << 20 and seconds < 5, (peak, seconds)
    lone_surrogate = json.dumps({"status": "ok", "bytes": 3}).encode() + b"\n\xed\xa0\x80"
    for forged in (
        lone_surrogate,
        b'{"status": "ok", "bytes": 99}\nshort',
        b'{"status": "win", "bytes": 1}\nx',
        b"\xff\n",
    ):
        result = sandbox.run(PYTHON_TOOL, {"code": FORGED.format(frame=forged)})
        assert result.status == "crash" and "sent" in result.content, (forged, result)


def test_answer_validation_at_unit_level():
    assert answer(frame("héllo", "ok"), 0, LIMITS).content == "héllo"
    assert answer(frame("x" * 5000, "ok"), 0, LIMITS).status == "oversized"
    assert answer(b'{"status": "ok", "bytes": 1, "extra": 1}\nx', 0, LIMITS).status == "crash"
    assert answer(b'{"status": "ok", "bytes": true}\nx', 0, LIMITS).status == "crash"
    assert answer(b"", -signal.SIGABRT, LIMITS).content == "Error: the tool process died (signal 6)"
    assert answer(b"", 128 + signal.SIGABRT, LIMITS, isolated=True).content.endswith("(signal 6)")
    assert answer(b"", 128 + signal.SIGXCPU, LIMITS, isolated=True).status == "timeout"


# ----- the parser --------------------------------------------------------------------------------------------
def test_the_parser_is_bounded_in_depth_size_count_and_time():
    # CPU time, not the wall clock: about 2 ms here alone; in make test's two streams the wall clock once read 1.3 s
    start = time.process_time()
    unclosed = parse_hermes("<tool_call>" * 100_000)
    nested = parse_hermes('<tool_call>{"name": "python", "arguments": ' + "[" * 3000 + "]" * 3000 + "}</tool_call>")
    deep_string = parse_hermes('<tool_call>{"name": "a", "arguments": "' + '{\\"a\\": ' * 3000 + '"}</tool_call>')
    many = parse_hermes('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>' * 10_000)
    huge = parse_hermes('<tool_call>{"name": "python", "arguments": {"code": "' + "x" * 300_000 + '"}}</tool_call>')
    assert time.process_time() - start < 1.0
    assert unclosed.calls == [] and unclosed.errors == ["malformed tool call: <tool_call> without </tool_call>"]
    assert nested.errors == ["malformed tool call: nested deeper than 32 levels"]
    assert deep_string.calls == [] and len(deep_string.errors) == 1
    assert len(many.calls) == 64 and "more than 64 calls" in many.errors[-1]
    assert huge.calls == [] and "longer than" in huge.errors[0]


# ----- where bubblewrap cannot run ---------------------------------------------------------------------------
def test_tools_that_run_model_code_are_refused_without_isolation(monkeypatch):
    from mindspeed_rl.tools import isolation

    monkeypatch.setattr(isolation, "bwrap_unavailable", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(IsolationUnavailable, match="apt-get install bubblewrap.*sandbox.isolation: none"):
        choose("bwrap", ["python"])
    assert choose("bwrap", []) == (
        "none",
        "tools run as plain child processes (bubblewrap (bwrap) is not installed; none of them runs "
        "model-written code)",
    )
    kind, warning = choose("none", ["python"])
    assert kind == "none" and warning.startswith("warning: rl_config.sandbox.isolation is none")
    with pytest.raises(IsolationUnavailable):
        Sandbox(LIMITS, "bwrap")


def test_preflight_refuses_model_code_without_isolation_and_warns_for_none(monkeypatch, capsys):
    """A run's start: exit-2 error naming the key and the tools, a note for the calculator alone, a warning for
    tool_isolation none; all before Ray (preflight)."""
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.tools import isolation
    from mindspeed_rl.trainer.startup.preflight import check_tool_isolation
    from mindspeed_rl.utils.cli import UserError

    monkeypatch.setattr(isolation, "bwrap_unavailable", lambda: "bubblewrap (bwrap) is not installed")
    agent = ["rl_config.rollout_function=tool_agent", "rl_config.prompt_type=qwen"]
    with pytest.raises(
        UserError, match=r"rl_config.sandbox.isolation: bwrap: the tools python run model-written code .* not installed"
    ):
        check_tool_isolation(load_ppo_config("ppo_qwen25_32b_A3", agent + ["rl_config.tools=[calculator,python]"]))
    check_tool_isolation(load_ppo_config("ppo_qwen25_32b_A3", agent + ["rl_config.tools=[calculator]"]))
    assert "note: tools run as plain child processes" in capsys.readouterr().out
    none = ["rl_config.tools=[python]", "rl_config.sandbox.isolation=none"]
    check_tool_isolation(load_ppo_config("ppo_qwen25_32b_A3", agent + none))
    assert "warning: rl_config.sandbox.isolation is none" in capsys.readouterr().out


def test_check_env_reports_the_tool_sandbox(monkeypatch, capsys):
    from cli import check_env
    from mindspeed_rl.tools import isolation

    if not bwrap_unavailable():
        assert check_env.main(["--steps", "tools"]) == 0
        assert "tools      : OK  bubblewrap isolates a python tool call" in capsys.readouterr().out
    monkeypatch.setattr(isolation, "bwrap_unavailable", lambda: "bubblewrap (bwrap) is not installed")
    assert check_env.main(["--steps", "tools"]) == 0
    assert "tools      : WARNING  bubblewrap (bwrap) is not installed" in capsys.readouterr().out
