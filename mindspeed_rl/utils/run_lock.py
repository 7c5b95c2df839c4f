"""One live run per folder: a lock file in each save and log folder, naming the run that holds it.

Two runs writing one checkpoint folder overwrite each other's iterations; two runs logging into one folder
interleave one ``metrics.jsonl``. A run takes ``.mindspeed_rl.lock`` in every folder it writes (holding its
pid, host and start time) and removes it when it ends. The lock appears complete or not at all: it is written
to a temporary file beside it and hard-linked to its name, which fails when a lock exists. A lock whose
process is gone (same host, pid not running) is stale: it is taken over with a note. A lock held from another
host cannot be checked from here, and a lock file that cannot be read or parsed cannot be judged: both are
refused with the way out (delete the file once no run uses the folder).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import stat
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

LOCK_NAME = ".mindspeed_rl.lock"
MAX_LOCK_BYTES = 4096  # a real lock is under 100 bytes
MAX_PID = 2**31 - 1


class FolderLocked(RuntimeError):
    """Another live run holds the folder, the folder cannot be written, or its lock file cannot be judged."""


class LockUnreadable(ValueError):
    """The lock file exists but is not a lock this module wrote (the message says what is wrong)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def parse_lock(raw: bytes) -> Dict:
    """The holder in a lock file's bytes; raises LockUnreadable saying what is wrong."""
    if not raw.strip():
        raise LockUnreadable("it is empty")
    if len(raw) > MAX_LOCK_BYTES:
        raise LockUnreadable(f"it is over {MAX_LOCK_BYTES} bytes")
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise LockUnreadable("it is not JSON") from None
    if not isinstance(holder, dict):
        raise LockUnreadable(f"it holds a JSON {type(holder).__name__}, not an object")
    pid, host, started = holder.get("pid"), holder.get("host"), holder.get("started")
    if type(pid) is not int or not 0 < pid <= MAX_PID:
        raise LockUnreadable(f"its pid is {pid!r}, not a process id")
    if not isinstance(host, str) or not host:
        raise LockUnreadable(f"its host is {host!r}, not a host name")
    if type(started) not in (int, float) or not math.isfinite(started) or started < 0:
        raise LockUnreadable(f"its start time is {started!r}, not a time")
    return holder


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder"}  # fmt: skip


def _not_regular(mode: int) -> str:
    """'' for a regular file, else what the file is ("it is a FIFO, not a regular file")."""
    if stat.S_ISREG(mode):
        return ""
    return f"it is {_KINDS.get(stat.S_IFMT(mode), 'not a file')}, not a regular file"


def _open_regular(path: str, flags: int) -> int:
    """An fd on ``path`` only when it is a regular file: anything else (a FIFO whose read would block forever,
    a socket, a device whose opening alone may act) is refused with LockUnreadable before it is opened, and
    after (a file swapped in between). FileNotFoundError when there is none."""
    why = _not_regular(os.stat(path).st_mode)
    if why:
        raise LockUnreadable(why)
    fd = os.open(path, flags | os.O_NONBLOCK)
    why = _not_regular(os.fstat(fd).st_mode)
    if why:
        os.close(fd)
        raise LockUnreadable(why)
    return fd


def read_lock(path: str) -> Dict:
    """The holder of the lock file ``path``; FileNotFoundError when there is none, LockUnreadable when it
    is not a regular file or cannot be read or parsed."""
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise LockUnreadable(f"it cannot be read ({exc.strerror or exc})") from None
    try:
        return parse_lock(os.read(fd, MAX_LOCK_BYTES + 1))
    except OSError as exc:
        raise LockUnreadable(f"it cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def holder_text(holder: Dict) -> str:
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
    except (OverflowError, ValueError, OSError):
        since = "an unknown time"
    return f"pid {holder['pid']} on {holder['host']}, since {since}"


def _link_lock(folder: str, path: str, me: Dict) -> bool:
    """Create the lock file holding ``me`` atomically; False when a lock exists."""
    fd, tmp = tempfile.mkstemp(prefix=LOCK_NAME + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(me, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.remove(tmp)


def _open_lock(path: str) -> int:
    """An fd on the lock file, a regular file (LockUnreadable otherwise): read-write where allowed (NFS locks
    need it), else read-only."""
    try:
        return _open_regular(path, os.O_RDWR)
    except PermissionError:
        return _open_regular(path, os.O_RDONLY)


class RunLock:
    """The locks of one run on ``folders`` ((key, folder) pairs; the key names the folder in messages)."""

    def __init__(self, folders: Sequence[Tuple[str, str]]):
        seen, self.folders = set(), []
        for key, folder in folders:
            real = os.path.realpath(folder)
            if folder and real not in seen:
                seen.add(real)
                self.folders.append((key, folder))
        self.held: List[str] = []
        self.notes: List[str] = []
        self.me: Dict = {}

    def acquire(self) -> "RunLock":
        self.me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        try:
            for key, folder in self.folders:
                try:
                    os.makedirs(folder, exist_ok=True)
                    self._take(key, folder)
                except OSError as exc:
                    what = "logs" if key.endswith("log_dir") else "checkpoints"
                    raise FolderLocked(f"{key}: cannot write {what} to {folder} ({exc.strerror or exc})") from None
        except BaseException:
            self.release()
            raise
        return self

    def _take(self, key: str, folder: str) -> None:
        path = os.path.join(folder, LOCK_NAME)
        for _ in range(3):
            if _link_lock(folder, path, self.me):
                self.held.append(path)
                return
            try:
                fd = _open_lock(path)
            except FileNotFoundError:
                continue  # released meanwhile: try again
            except (OSError, LockUnreadable) as exc:
                raise FolderLocked(self._unjudged(key, folder, path, exc)) from None
            try:
                try:
                    holder = parse_lock(os.read(fd, MAX_LOCK_BYTES + 1))
                except (OSError, LockUnreadable) as exc:
                    raise FolderLocked(self._unjudged(key, folder, path, exc)) from None
                if holder["host"] != self.me["host"]:
                    raise FolderLocked(
                        f"{key}: {folder} is used by a run on another host ({holder_text(holder)}); "
                        f"if that run is gone, delete {path}"
                    )
                if holder["pid"] != self.me["pid"] and _alive(holder["pid"]):
                    raise FolderLocked(
                        f"{key}: {folder} is used by a live run ({holder_text(holder)}); give this "
                        "run its own folder or stop that one"
                    )
                if self._take_over(key, folder, path, fd, holder):
                    return
            finally:
                os.close(fd)  # drops the flock _take_over may hold
        raise FolderLocked(f"{key}: could not lock {folder} (another run is starting there?)")

    @staticmethod
    def _unjudged(key: str, folder: str, path: str, exc: Exception) -> str:
        why = f"it cannot be read ({exc.strerror or exc})" if isinstance(exc, OSError) else str(exc)
        return f"{key}: the run lock {path} cannot be judged: {why}. Delete it once you are sure no run uses {folder}"

    def _take_over(self, key: str, folder: str, path: str, fd: int, holder: Dict) -> bool:
        """Replace the stale lock open as ``fd`` by this run's; False when someone else changed it first.

        Contenders that judged the same lock stale serialise on an flock of that very file, and each removes
        the name only while it still points at the file it locked (checked by inode: the open fd keeps the
        inode from being reused). The first removes it and links its own lock; the others then find the name
        gone or pointing at a new file and look again, to find a live run's lock. Nobody else removes a
        lock file: its owner does when it ends, and only its own."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise FolderLocked(
                f"{key}: {folder} holds the stale lock of a run that is gone ({holder_text(holder)}), and its "
                f"file system cannot lock that file to take it over safely ({exc.strerror or exc}); delete {path}"
            ) from None
        try:
            now = os.stat(path)
        except FileNotFoundError:
            return False
        if (now.st_dev, now.st_ino) != (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
            return False
        os.remove(path)
        if not _link_lock(folder, path, self.me):
            return False
        self.notes.append(f"{key}: took over the stale lock of a run that is gone ({holder_text(holder)})")
        self.held.append(path)
        return True

    def release(self) -> None:
        """Remove the locks this run holds; a lock file that is no longer this run's is left alone. No flock
        is needed: while this run lives, nobody else removes its lock (see _take_over)."""
        for path in self.held:
            try:
                if read_lock(path) == self.me:
                    os.remove(path)
            except (OSError, LockUnreadable):
                pass
        self.held = []

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
