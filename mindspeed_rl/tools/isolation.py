"""Where a tool call's process runs: inside bubblewrap (``rl_config.sandbox.isolation: bwrap``, the default) or
as a plain child process of the driver (``isolation: none``, or tools that run no model-written code where
bubblewrap cannot run).

bubblewrap (https://github.com/containers/bubblewrap, Debian/Ubuntu/openEuler package ``bubblewrap``) starts
the call's process in new mount, PID, IPC, network, UTS and (where the kernel has them) cgroup namespaces, with
no capabilities, no new privileges, in a session of its own, killed with the driver, and never as host root:

- a driver that is not root runs bubblewrap unprivileged: a new user namespace maps the sandbox's ``nobody``
  to the driver's own (non-root) uid, and the sandbox cannot create further user namespaces;
- a driver that runs as root (as training containers do) would make that mapping ``nobody -> host root``,
  and the kernel lets host root write ``/proc/sys`` without any capability and exempts it from RLIMIT_NPROC.
  So bubblewrap builds the namespaces with root's rights and ``setpriv`` then drops the call's process to a
  uid and gid of its own (``call_uid``: held by one running call at a time, in a range no account uses) with no
  supplementary groups, no capabilities in any set and no_new_privs, before the interpreter starts.

Its file system is built from nothing:

    /usr, /lib*, /bin, /sbin, /etc/ld.so.cache    read-only (the system's libraries)
    the interpreter's prefix and virtualenv       read-only (Python and its installed packages)
    /sandbox/code/<package>                       read-only: mindspeed_rl/tools, utils/plugins.py, the tools' packages
    /scratch (the working folder, HOME, TMPDIR)   writable, a RAM file system of ``scratch_mb``
    /proc (its own PIDs), /dev (null, zero, urandom, ...)
    /proc/sys and the procfs folders that set host state (fs, irq, bus, ...)   empty and read-only
    /proc/sysrq-trigger and the kernel's other global files (keys, kmsg, ...)  read-only, empty (/dev/null)
    /sys and everything else, / included          absent, read-only and empty

so the driver's files, checkpoints, data, home, ``sys.path`` folders and other users' files do not exist for
it, and the network is only a loopback that is down. When the call ends its PID namespace ends with it: every
process it started dies.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from functools import lru_cache
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

ISOLATIONS = ("bwrap", "none")
CODE_ROOT = "/sandbox/code"
SCRATCH = "/scratch"
NOBODY = 65534
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; RHEL/openEuler: dnf install bubblewrap; "
    "scripts/install.sh does it when run as root); a root driver also needs setpriv (util-linux), others "
    "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 where the kernel has that switch)"
)


class IsolationUnavailable(RuntimeError):
    """The requested isolation cannot run on this host (the message says why and the way out)."""


def _interpreter_dirs() -> List[str]:
    """The folders the interpreter needs read-only: its prefix, the virtualenv, the executable's folder."""
    dirs = []
    for path in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(path)
        if real.startswith("/usr/") or real == "/usr":
            continue
        if not any(real == d or real.startswith(d + os.sep) for d in dirs):
            dirs.append(real)
    if sys.prefix != sys.base_prefix and os.path.realpath(sys.prefix) != sys.prefix:
        dirs.append(sys.prefix)  # a virtualenv reached through a symlink: bound where the driver sees it
    return dirs


def _inside_interpreter(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(d + os.sep) for d in _interpreter_dirs() + ["/usr"])


def code_mounts(functions: Iterable[str]) -> Dict[str, str]:
    """{source on the host: target in the sandbox} for the code a tool call imports: the tools package of
    mindspeed_rl (the child's own code), the plug-in loader (``utils/plugins.py``) and the top-level package
    (or module file) of every tool function not installed in the interpreter's prefix."""
    import mindspeed_rl

    package = os.path.dirname(os.path.abspath(mindspeed_rl.__file__))
    mounts = {
        os.path.join(package, "__init__.py"): f"{CODE_ROOT}/mindspeed_rl/__init__.py",
        os.path.join(package, "tools"): f"{CODE_ROOT}/mindspeed_rl/tools",
        # the plug-in loader the child imports the tool function with
        os.path.join(package, "utils", "__init__.py"): f"{CODE_ROOT}/mindspeed_rl/utils/__init__.py",
        os.path.join(package, "utils", "plugins.py"): f"{CODE_ROOT}/mindspeed_rl/utils/plugins.py",
    }
    for function in functions:
        top = function.partition(":")[0].split(".")[0]
        if top == "mindspeed_rl":
            if not function.startswith("mindspeed_rl.tools."):
                mounts = {k: v for k, v in mounts.items() if not k.startswith(package + os.sep)}
                mounts[package] = f"{CODE_ROOT}/mindspeed_rl"
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue  # the child reports the import error to the model
        if spec.submodule_search_locations:
            source, target = list(spec.submodule_search_locations)[0], f"{CODE_ROOT}/{top}"
        elif spec.origin and os.path.isfile(spec.origin):
            source, target = spec.origin, f"{CODE_ROOT}/{os.path.basename(spec.origin)}"
        else:
            continue  # built in or frozen: part of the interpreter
        if not _inside_interpreter(source):
            mounts[os.path.realpath(source)] = target
    return mounts


# procfs entries that set (or reveal) host-wide kernel state: each one the host's kernel has is covered inside
_PROC_FOLDERS = ("sys", "fs", "irq", "bus", "acpi", "scsi", "asound", "driver")  # an empty read-only folder
_PROC_FILES = (  # /dev/null, read-only
    "sysrq-trigger",
    "kcore",
    "kmsg",
    "keys",
    "key-users",
    "kallsyms",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "mtrr",
)
UID_BASE = 1 << 30  # the host uids of a root driver's calls: [2^30, 2^30 + 2^28), a range no account uses
UID_SLOTS = 64  # uids of one driver process: at most this many of its calls run at once


class NoFreeUid(RuntimeError):
    """Every uid of this driver process is held by a running call."""


class _UidSlots:
    """The uid slots of this driver process not held by a running call, the longest free first (so that a
    slot whose call's last processes may still be exiting is taken last)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Every slot free: a forked child has a pid, so uids, of its own (and no lock held by another thread)."""
        self._free = collections.deque(range(UID_SLOTS))
        self._changed = threading.Condition()

    def take(self, wait_s: float) -> int:
        with self._changed:
            if not self._changed.wait_for(lambda: self._free, timeout=wait_s):
                raise NoFreeUid(f"all {UID_SLOTS} tool-call uids of this process are held by running calls")
            return self._free.popleft()

    def give_back(self, slot: int) -> None:
        with self._changed:
            if slot not in self._free:  # taken before a fork: free in the child already
                self._free.append(slot)
                self._changed.notify()


_uid_slots = _UidSlots()
os.register_at_fork(after_in_child=_uid_slots.reset)


def as_root() -> bool:
    """Whether the driver runs as root, so that the call's process must be dropped to another uid."""
    return os.geteuid() == 0


@contextlib.contextmanager
def call_uid(wait_s: float) -> Iterator[Optional[int]]:
    """The host uid and gid of one call of a root driver (None for another driver), held until the block ends:
    the driver's pid and a slot no running call of this process holds make it unique among the calls running
    in one PID namespace, so that RLIMIT_NPROC counts the call's own threads. NoFreeUid when no slot frees
    within ``wait_s`` seconds."""
    if not as_root():
        yield None
        return
    slot = _uid_slots.take(wait_s)
    try:
        yield UID_BASE + os.getpid() * UID_SLOTS + slot
    finally:
        _uid_slots.give_back(slot)


def drop_privileges(argv: List[str], uid: Optional[int]) -> List[str]:
    """``argv`` as the sandbox runs it: under a root driver ``setpriv`` first drops to ``uid`` (``call_uid``; no
    supplementary groups, every capability set emptied, no_new_privs), so the interpreter never runs as root."""
    if not as_root():
        return argv
    if uid is None:
        raise ValueError("a root driver's tool call needs a uid of its own (call_uid)")
    setpriv = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--inh-caps=-all"]
    return setpriv + ["--bounding-set=-all", "--no-new-privs", "--", *argv]


def _bind(source: str, target: str, made: set, how: str = "--ro-bind") -> List[str]:
    """A read-only bind of ``source`` on ``target``, after the target's missing parents as 0755 folders (a root
    bubblewrap makes them 0700, which the unprivileged call could not cross)."""
    args: List[str] = []
    parent = os.path.dirname(target)
    parents = []
    while parent not in ("/", "") and parent not in made:
        parents.append(parent)
        parent = os.path.dirname(parent)
    for folder in reversed(parents):
        made.add(folder)
        args += ["--perms", "0755", "--dir", folder]
    return args + [how, source, target]


def _system_mounts(made: set) -> List[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in ("/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += _bind("/etc/ld.so.cache", "/etc/ld.so.cache", made, "--ro-bind-try")
    for folder in _interpreter_dirs():
        args += _bind(folder, folder, made)
    return args


def _proc_covers() -> List[str]:
    args: List[str] = []
    for name in _PROC_FOLDERS:
        if os.path.isdir(f"/proc/{name}"):
            args += ["--tmpfs", f"/proc/{name}", "--remount-ro", f"/proc/{name}"]
    for name in _PROC_FILES:
        if os.path.lexists(f"/proc/{name}"):
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    return args


def bwrap_prefix(mounts: Dict[str, str], env: Dict[str, str], scratch_mb: int) -> List[str]:
    """The bubblewrap command line up to ``--`` (module docstring); ``drop_privileges(argv)`` follows it."""
    if as_root():  # bubblewrap keeps root's rights to build the namespaces; setpriv drops them after
        user = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        user = ["--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    made: set = set()
    args = [
        shutil.which("bwrap") or "bwrap",
        *("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"),
        *("--die-with-parent", "--new-session", "--hostname", "tool"),
        *user,
        *_system_mounts(made),
    ]
    for source, target in sorted(mounts.items(), key=lambda item: item[1]):
        args += _bind(source, target, made)
    args += ["--proc", "/proc", *_proc_covers(), "--dev", "/dev"]
    args += ["--perms", "0777", "--size", str(scratch_mb << 20), "--tmpfs", SCRATCH]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SCRATCH, "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args + ["--"]


def bwrap_command(
    mounts: Dict[str, str], env: Dict[str, str], scratch_mb: int, argv: List[str], uid: Optional[int]
) -> List[str]:
    """The whole command line that runs ``argv`` isolated (as ``uid`` under a root driver)."""
    return bwrap_prefix(mounts, env, scratch_mb) + drop_privileges(argv, uid)


@lru_cache(maxsize=1)
def bwrap_unavailable() -> str:
    """Why bubblewrap cannot isolate a tool call on this host ('' when it can): it is run once, exactly as a
    call would run it, on an interpreter that does nothing."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if as_root() and not os.path.realpath(shutil.which("setpriv") or "/nonexistent").startswith("/usr/"):
        return "setpriv (util-linux) is not installed in /usr: it drops a root driver's tool calls to another uid"
    try:
        with call_uid(30.0) as uid:
            command = bwrap_command(code_mounts(()), {"LANG": "C.UTF-8"}, 1, [sys.executable, "-S", "-c", "pass"], uid)
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, cwd="/")
    except (OSError, subprocess.TimeoutExpired, NoFreeUid) as exc:
        return f"bwrap did not run ({exc})"
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap failed here: {said[-1] if said else f'exit code {done.returncode}'}"
    return ""


def require(isolation: str) -> None:
    """Raises IsolationUnavailable when ``isolation`` cannot run here."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
    why = bwrap_unavailable() if isolation == "bwrap" else ""
    if why:
        raise IsolationUnavailable(f"{why}: {INSTALL_HINT}")


def choose(requested: str, code_tools: Sequence[str]) -> Tuple[str, Optional[str]]:
    """(isolation to use, a note for the start of the run or None) for ``rl_config.sandbox.isolation``.

    ``bwrap`` where bubblewrap runs; where it does not, tools that run no model-written code (the calculator)
    run in plain child processes with a note, and ``code_tools`` (the names of those that do) are refused
    (IsolationUnavailable) unless the config asks for ``none``, which runs them unisolated with a warning."""
    if requested not in ISOLATIONS:
        raise ValueError(f"rl_config.sandbox.isolation must be one of {', '.join(ISOLATIONS)}, not {requested!r}")
    if requested == "none":
        if not code_tools:
            return "none", None
        return "none", (
            "warning: rl_config.sandbox.isolation is none: model-written tool code runs as a plain child process "
            "with the driver's rights (it can read and write what the run can, and signal it); use it only "
            "for trusted tools or on a throw-away machine"
        )
    why = bwrap_unavailable()
    if not why:
        return "bwrap", None
    if not code_tools:
        return "none", f"tools run as plain child processes ({why}; none of them runs model-written code)"
    raise IsolationUnavailable(
        f"the tools {', '.join(code_tools)} run model-written code and need bubblewrap to isolate it, but "
        f"{why}: {INSTALL_HINT}; "
        "or set rl_config.sandbox.isolation: none to run them without isolation (unsafe: the code can reach "
        "the run's files and processes)"
    )
