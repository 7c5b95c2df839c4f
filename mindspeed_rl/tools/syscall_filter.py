"""The seccomp filter a tool call runs under, compiled and loaded by libseccomp (the OS library, through ctypes).

Loaded by the tool's own process right before the tool function runs (``tool_process.py``); a filter can
never be removed, only added to, so nothing the tool does afterwards lifts it. Every listed call fails with
EPERM (clone3 with ENOSYS, so that threads fall back to clone, whose flags can be checked):

- no new processes and no programs: fork, vfork, execve, execveat, and clone without CLONE_THREAD (threads
  stay allowed; their number is bounded by RLIMIT_NPROC);
- nothing that reaches other processes or the kernel's global state: ptrace, process_vm_*, pidfd_getfd,
  prlimit64 on another process, mount and the new mount API, namespaces (unshare, setns), bpf, perf events,
  userfaultfd, keyrings, io_uring (its requests would bypass this filter), kernel modules, kexec, reboot, swap,
  clocks, quotas, the kernel log, file handles (open_by_handle_at), chroot;
- no vsock sockets (socket and socketpair with AF_VSOCK): network namespaces do not cover them, so a call
  could reach the host or other VMs (or listen for them) through one.

Syscalls of another ABI than the interpreter's (e.g. 32-bit calls on x86_64) kill the process (libseccomp's
default for a foreign architecture).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from functools import lru_cache
from typing import Optional, Sequence, Tuple

SONAMES = ("libseccomp.so.2", "libseccomp.so")
ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW
CMP_NE, CMP_MASKED_EQ = 1, 7  # enum scmp_compare
CLONE_THREAD = 0x00010000
AF_VSOCK = 40
INT_BITS = 0xFFFFFFFF  # an int argument: the kernel reads its low 32 bits only, whatever the register's upper half

DENIED = (
    "fork",
    "vfork",
    "execve",
    "execveat",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "quotactl",
    "name_to_handle_at",
    "open_by_handle_at",
    "lookup_dcookie",
    "vhangup",
)


class _ArgCmp(ctypes.Structure):  # struct scmp_arg_cmp
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


@lru_cache(maxsize=1)
def _library() -> Tuple[Optional[ctypes.CDLL], str]:
    """(libseccomp, '') or (None, why not)."""
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError:
            continue
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_ArgCmp),
        ]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        return lib, ""
    return None, "libseccomp is not installed (Debian/Ubuntu: libseccomp2; RHEL/openEuler: libseccomp)"


def _candidates():
    yield from SONAMES
    found = ctypes.util.find_library("seccomp")  # runs ldconfig: only when the usual names are not found
    if found:
        yield found


def unavailable_reason() -> str:
    """Why no filter can be loaded here ('' when one can)."""
    return _library()[1]


def _rule(lib, ctx, action: int, name: str, args: Sequence[Tuple[int, int, int, int]] = ()) -> None:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:
        return  # a call this architecture does not have (e.g. fork on aarch64): nothing to deny
    array = (_ArgCmp * max(1, len(args)))(*[_ArgCmp(*a) for a in args])
    rc = lib.seccomp_rule_add_array(ctx, action, number, len(args), array)
    if rc < 0:
        raise OSError(-rc, f"seccomp: cannot add the rule for {name}: {os.strerror(-rc)}")


def load() -> None:
    """Load the filter (module docstring) into this process and every thread or child it makes later."""
    lib, why = _library()
    if lib is None:
        raise OSError(errno.ENOSYS, why)
    ctx = lib.seccomp_init(ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:
        eperm = _errno_action(errno.EPERM)
        for name in DENIED:
            _rule(lib, ctx, eperm, name)
        _rule(lib, ctx, eperm, "clone", [(0, CMP_MASKED_EQ, CLONE_THREAD, 0)])  # flags & CLONE_THREAD == 0
        _rule(lib, ctx, _errno_action(errno.ENOSYS), "clone3")
        _rule(lib, ctx, eperm, "prlimit64", [(0, CMP_NE, 0, 0)])  # pid != 0: another process
        for name in ("socket", "socketpair"):
            _rule(lib, ctx, eperm, name, [(0, CMP_MASKED_EQ, INT_BITS, AF_VSOCK)])  # domain == AF_VSOCK
        rc = lib.seccomp_load(ctx)  # sets no_new_privs first (libseccomp's default)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")
    finally:
        lib.seccomp_release(ctx)
