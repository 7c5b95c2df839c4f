"""One live run per folder: a lock file in each save and log folder, naming the run that holds it.

Two runs writing one checkpoint folder overwrite each other's iterations; two runs logging into one folder
interleave one ``metrics.jsonl``. A run takes ``.mindspeed_rl.lock`` in every folder it writes (created
exclusively, holding its pid, host and start time) and removes it when it ends. A lock whose process is gone
(same host, pid not running) is stale: it is taken over with a note. A lock held from another host cannot be
checked from here and is refused with the way out (delete the file once that run is gone).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from typing import Dict, List, Optional, Sequence, Tuple

LOCK_NAME = ".mindspeed_rl.lock"


class FolderLocked(RuntimeError):
    """Another live run holds the folder, or the folder cannot be written."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def read_lock(folder: str) -> Optional[Dict]:
    try:
        with open(os.path.join(folder, LOCK_NAME), encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as stale below


def holder_text(holder: Dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {since}"


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

    def acquire(self) -> "RunLock":
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        try:
            for key, folder in self.folders:
                try:
                    os.makedirs(folder, exist_ok=True)
                    self._take(key, folder, me)
                except OSError as exc:
                    what = "logs" if key.endswith("log_dir") else "checkpoints"
                    raise FolderLocked(f"{key}: cannot write {what} to {folder} ({exc.strerror or exc})") from None
        except BaseException:
            self.release()
            raise
        return self

    def _take(self, key: str, folder: str, me: Dict) -> None:
        path = os.path.join(folder, LOCK_NAME)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
                holder = read_lock(folder)
                if holder is None:
                    continue  # released meanwhile
                if holder and holder.get("host") != me["host"]:
                    raise FolderLocked(
                        f"{key}: {folder} is used by a run on another host ({holder_text(holder)}); "
                        f"if that run is gone, delete {path}"
                    ) from None
                if holder and _alive(int(holder.get("pid", -1))) and holder.get("pid") != me["pid"]:
                    raise FolderLocked(
                        f"{key}: {folder} is used by a live run ({holder_text(holder)}); give this "
                        "run its own folder or stop that one"
                    ) from None
                self.notes.append(
                    f"{key}: took over the stale lock of a run that is gone "
                    f"({holder_text(holder) if holder else 'unreadable lock'})"
                )
                os.remove(path)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(me, fh)
            self.held.append(path)
            return
        raise FolderLocked(f"{key}: could not lock {folder} (another run is starting there?)")

    def release(self) -> None:
        for path in self.held:
            try:
                holder = json.load(open(path, encoding="utf-8"))
                if holder.get("pid") == os.getpid():
                    os.remove(path)
            except (OSError, ValueError):
                pass
        self.held = []

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
