"""The run lock (mindspeed_rl/utils/run_lock.py): exactly one of many racing runs wins a folder, a stale lock
is taken over by exactly one contender, and a lock file that cannot be judged is refused naming its path."""

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

import pytest

from mindspeed_rl.utils.run_lock import LOCK_NAME, FolderLocked, RunLock

CONTENDERS = 12
ROUNDS = 25
KEY = "actor_config.save"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_stale_lock(folder: str) -> int:
    pid = dead_pid()
    with open(os.path.join(folder, LOCK_NAME), "w", encoding="utf-8") as fh:
        json.dump({"pid": pid, "host": socket.gethostname(), "started": time.time() - 60}, fh)
    return pid


def contend(folder, rounds, start, tried, released, results):
    """Each round: wait for the start, try the lock, wait until every contender has tried, let go."""
    for r in range(rounds):
        start.wait()
        lock = RunLock([(KEY, folder)])
        try:
            lock.acquire()
            results.put((r, "won", " | ".join(lock.notes)))
        except FolderLocked as exc:
            results.put((r, "refused", str(exc)))
        except BaseException as exc:  # anything else is a failure of the test
            results.put((r, "error", repr(exc)))
        tried.wait()
        lock.release()
        released.wait()


def race(folder: str, before_round=lambda: None):
    """Run CONTENDERS processes for ROUNDS rounds on ``folder``; returns the results of each round."""
    ctx = mp.get_context("fork")
    start, tried, released = (ctx.Barrier(CONTENDERS + 1, timeout=60) for _ in range(3))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=contend, args=(folder, ROUNDS, start, tried, released, results)) for _ in range(CONTENDERS)
    ]
    for p in procs:
        p.start()
    rounds, leftovers = [], []
    try:
        for _ in range(ROUNDS):
            before_round()
            start.wait()
            tried.wait()
            rounds.append([results.get(timeout=60) for _ in range(CONTENDERS)])
            released.wait()
            leftovers.append(sorted(os.listdir(folder)))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    return rounds, leftovers


def test_many_racing_runs_exactly_one_wins_each_round(tmp_path):
    folder = str(tmp_path / "ckpt")
    os.makedirs(folder)
    rounds, leftovers = race(folder)
    for outcomes in rounds:
        kinds = sorted(kind for _, kind, _ in outcomes)
        assert kinds == ["refused"] * (CONTENDERS - 1) + ["won"], outcomes
        refused = [text for _, kind, text in outcomes if kind == "refused"]
        assert all(f"{KEY}: {folder} is used by a live run (pid " in text for text in refused), refused
    assert leftovers == [[]] * ROUNDS  # the winner released its lock; no temporary file is left behind


def test_contenders_for_one_stale_lock_exactly_one_takes_it_over(tmp_path):
    folder = str(tmp_path / "ckpt")
    os.makedirs(folder)
    rounds, leftovers = race(folder, before_round=lambda: write_stale_lock(folder))
    for outcomes in rounds:
        won = [text for _, kind, text in outcomes if kind == "won"]
        assert len(won) == 1, outcomes
        # the winner took the stale lock over, or linked its own just after another contender removed it
        assert won[0] == "" or won[0].startswith(f"{KEY}: took over the stale lock of a run that is gone (pid ")
        assert all(kind == "refused" and "is used by a live run" in text for _, kind, text in outcomes if kind != "won")
    assert leftovers == [[]] * ROUNDS


def test_a_stale_lock_is_taken_over_with_a_note_naming_the_gone_run(tmp_path):
    pid = write_stale_lock(str(tmp_path))
    lock = RunLock([(KEY, str(tmp_path))]).acquire()
    assert len(lock.notes) == 1
    assert lock.notes[0].startswith(
        f"{KEY}: took over the stale lock of a run that is gone (pid {pid} on {socket.gethostname()}, since "
    )
    assert json.load(open(tmp_path / LOCK_NAME))["pid"] == os.getpid()
    lock.release()
    assert os.listdir(tmp_path) == []


GARBAGE = {
    "empty": b"",
    "blank": b"  \n",
    "pid_not_a_number": b'{"pid": "abc"}',
    "pid_a_string_with_host": json.dumps({"pid": "abc", "host": socket.gethostname(), "started": 0}).encode(),
    "pid_a_bool": json.dumps({"pid": True, "host": socket.gethostname(), "started": 0}).encode(),
    "pid_negative": json.dumps({"pid": -1, "host": socket.gethostname(), "started": 0}).encode(),
    "pid_huge": json.dumps({"pid": 10**30, "host": socket.gethostname(), "started": 0}).encode(),
    "no_host": b'{"pid": 12345, "started": 0}',
    "host_a_list": json.dumps({"pid": 12345, "host": ["a"], "started": 0}).encode(),
    "started_a_string": json.dumps({"pid": 12345, "host": socket.gethostname(), "started": "x"}).encode(),
    "started_nan": b'{"pid": 12345, "host": "h", "started": NaN}',
    "json_list": b"[1, 2, 3]",
    "json_string": b'"locked"',
    "json_null": b"null",
    "binary_junk": bytes(range(256)),
    "not_utf8_json": b'{"pid": 1, "host": "\xff\xfe"}',
    "deeply_nested": b"[" * 4000 + b"]" * 4000,
    "too_big": b'{"pid": 1, "host": "' + b"h" * 10000 + b'", "started": 0}',
    "truncated": b'{"pid": 12345, "host": "',
}


@pytest.mark.parametrize("content", list(GARBAGE.values()), ids=list(GARBAGE))
def test_a_lock_file_that_cannot_be_judged_is_refused_naming_its_path(tmp_path, content):
    path = tmp_path / LOCK_NAME
    path.write_bytes(content)
    with pytest.raises(FolderLocked) as caught:
        RunLock([(KEY, str(tmp_path))]).acquire()
    text = str(caught.value)
    assert text.startswith(f"{KEY}: the run lock {path} cannot be judged: ")
    assert text.endswith(f"Delete it once you are sure no run uses {tmp_path}")
    assert path.read_bytes() == content  # left as it was
    assert os.listdir(tmp_path) == [LOCK_NAME]


def test_a_folder_in_place_of_the_lock_file_is_refused_naming_its_path(tmp_path):
    (tmp_path / LOCK_NAME).mkdir()
    with pytest.raises(FolderLocked, match=f"the run lock {tmp_path}/{LOCK_NAME} cannot be judged: it is a folder"):
        RunLock([(KEY, str(tmp_path))]).acquire()


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_a_lock_that_is_not_a_regular_file_is_refused_without_being_opened(tmp_path, kind):
    """A FIFO blocked the start forever (its read waits for a writer); a device may act when opened."""
    import socket as sockets
    import threading

    path = tmp_path / LOCK_NAME
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = sockets.socket(sockets.AF_UNIX)
        server.bind(str(path))
    else:
        os.symlink("/dev/zero", path)  # endless bytes once opened and read
    done = {}
    worker = threading.Thread(target=lambda: done.update(error=_refusal(tmp_path)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the start blocked on the lock file"
    what = {"fifo": "a FIFO", "socket": "a socket", "device": "a character device"}[kind]
    assert f"the run lock {path} cannot be judged: it is {what}, not a regular file" in done["error"], done
    assert os.path.lexists(path)  # left as it was


def _refusal(folder) -> str:
    try:
        RunLock([(KEY, str(folder))]).acquire()
    except FolderLocked as exc:
        return str(exc)
    return "acquired"


def test_release_removes_only_its_own_lock(tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        theirs.mkdir()
        other = {"pid": holder.pid, "host": socket.gethostname(), "started": time.time()}
        (theirs / LOCK_NAME).write_text(json.dumps(other))
        # a run refused on its second folder lets go of its first and leaves the holder's lock alone
        with pytest.raises(FolderLocked, match="is used by a live run"):
            RunLock([(KEY, str(mine)), ("rl_config.log_dir", str(theirs))]).acquire()
        assert os.listdir(mine) == []
        assert json.loads((theirs / LOCK_NAME).read_text()) == other

        lock = RunLock([(KEY, str(mine))]).acquire()
        (mine / LOCK_NAME).write_text(json.dumps(other))  # replaced under the run (by hand)
        lock.release()
        assert json.loads((mine / LOCK_NAME).read_text()) == other

        (mine / LOCK_NAME).unlink()
        lock = RunLock([(KEY, str(mine))]).acquire()
        (mine / LOCK_NAME).write_bytes(b"\xff garbage")
        lock.release()  # no exception, the file is not this run's any more
        assert (mine / LOCK_NAME).read_bytes() == b"\xff garbage"

        (mine / LOCK_NAME).unlink()
        lock = RunLock([(KEY, str(mine))]).acquire()
        (mine / LOCK_NAME).unlink()
        lock.release()  # already gone: nothing to do
        assert os.listdir(mine) == []
    finally:
        holder.kill()
        holder.wait()


def test_another_hosts_lock_is_refused_with_the_way_out(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": 0}))
    with pytest.raises(FolderLocked) as caught:
        RunLock([(KEY, str(tmp_path))]).acquire()
    assert str(caught.value).startswith(f"{KEY}: {tmp_path} is used by a run on another host (pid 1 on elsewhere")
    assert str(caught.value).endswith(f"if that run is gone, delete {tmp_path}/{LOCK_NAME}")
