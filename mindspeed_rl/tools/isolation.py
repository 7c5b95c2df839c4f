"""Where a tool call's process runs: inside bubblewrap (``tool_isolation: bwrap``, the default) or as a plain
child process of the driver (``tool_isolation: none``, or tools that run no model-written code where
bubblewrap cannot run).

bubblewrap (https://github.com/containers/bubblewrap, Debian/Ubuntu/openEuler package ``bubblewrap``) starts
the call's process in new user, mount, PID, IPC, network, UTS and (where the kernel has them) cgroup
namespaces, with no capabilities, no new privileges, as ``nobody``, unable to create further user namespaces,
in a session of its own, killed with the driver. Its file system is built from nothing:

    /usr, /lib*, /bin, /sbin, /etc/ld.so.cache    read-only (the system's libraries)
    the interpreter's prefix and virtualenv       read-only (Python and its installed packages)
    /sandbox/code/<package>                       read-only: mindspeed_rl/tools, utils/plugins.py, the tools' packages
    /scratch (the working folder, HOME, TMPDIR)   writable, a RAM file system of ``scratch_mb``
    /proc (its own PIDs), /dev (null, zero, urandom, ...)
    everything else, / included                   read-only and empty

so the driver's files, checkpoints, data, home, ``sys.path`` folders and other users' files do not exist for
it, and the network is only a loopback that is down. When the call ends its PID namespace ends with it: every
process it started dies.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

ISOLATIONS = ("bwrap", "none")
CODE_ROOT = "/sandbox/code"
SCRATCH = "/scratch"
NOBODY = 65534
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; RHEL/openEuler: dnf install bubblewrap; "
    "scripts/install.sh does it when run as root) and allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1 where the kernel has that switch)"
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


def _system_mounts() -> List[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in ("/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for folder in _interpreter_dirs():
        args += ["--ro-bind", folder, folder]
    return args


def bwrap_command(mounts: Dict[str, str], env: Dict[str, str], scratch_mb: int, argv: List[str]) -> List[str]:
    """The bubblewrap command line that runs ``argv`` isolated (module docstring)."""
    args = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--hostname",
        "tool",
        *_system_mounts(),
    ]
    for source, target in sorted(mounts.items(), key=lambda item: item[1]):
        args += ["--ro-bind", source, target]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(scratch_mb << 20), "--tmpfs", SCRATCH]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SCRATCH, "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args + ["--"] + argv


@lru_cache(maxsize=1)
def bwrap_unavailable() -> str:
    """Why bubblewrap cannot isolate a tool call on this host ('' when it can): it is run once, exactly as a
    call would run it, on an interpreter that does nothing."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    command = bwrap_command(code_mounts(()), {"LANG": "C.UTF-8"}, 1, [sys.executable, "-S", "-c", "pass"])
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
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
    """(isolation to use, a note for the start of the run or None) for ``rl_config.tool_isolation``.

    ``bwrap`` where bubblewrap runs; where it does not, tools that run no model-written code (the calculator)
    run in plain child processes with a note, and ``code_tools`` (the names of those that do) are refused
    (IsolationUnavailable) unless the config asks for ``none``, which runs them unisolated with a warning."""
    if requested not in ISOLATIONS:
        raise ValueError(f"tool_isolation must be one of {', '.join(ISOLATIONS)}, not {requested!r}")
    if requested == "none":
        if not code_tools:
            return "none", None
        return "none", (
            "warning: rl_config.tool_isolation is none: model-written tool code runs as a plain child process "
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
        "or set rl_config.tool_isolation: none to run them without isolation (unsafe: the code can reach "
        "the run's files and processes)"
    )
