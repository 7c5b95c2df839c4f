"""The user's agent harness, started once per episode, pointed at the policy endpoint.

    entry_point  "pkg.module:function": ``function(task)`` in a thread of the driver, ``task`` an ``EpisodeTask``;
                 a number it returns is the episode's reward (as if posted)
    command      a shell command, one process (session) per episode, the task as JSON on its standard input;
                 exit code 0 ends the episode, another drops it; ``{python}`` in it is the run's interpreter
    shared       the command once for all episodes (``shared_harness``): each task a JSON line on its standard
                 input; it ends an episode by posting its reward or ``POST .../end``; if it exits, its open
                 episodes are dropped and the next episode starts it again

Both get ``OPENAI_BASE_URL`` (the episode's own base URL, so that a plain OpenAI client names its episode without
knowing it), ``OPENAI_API_KEY`` and ``MINDSPEED_RL_EPISODE_ID``; a command's output goes to ``harness.log`` in the
run's log folder. A command whose episode ended is given ``grace_s`` to exit, then killed with its process group.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ...utils.cli import first_line


@dataclass
class EpisodeTask:
    """What a harness is told about its episode."""

    episode_id: str
    base_url: str  # this episode's: requests to it need no episode id
    api_key: str
    model: str
    messages: List[Dict[str, str]]  # the task as chat messages (the dataset's prompt, its template undone)
    prompt: str  # the same as text, chat template applied
    prompt_token_ids: List[int]
    label: str  # the dataset's reference answer, for a harness that scores the episode itself
    extra: Dict[str, Any] = field(default_factory=dict)

    def client(self, **kwargs):
        """An ``openai.OpenAI`` client for this episode, on the connection pool the run's episodes share (a client
        of its own builds a TLS context: 30 ms of the driver's CPU per episode); do not close it."""
        import openai

        kwargs.setdefault("http_client", shared_http_client())
        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)


@functools.lru_cache(maxsize=1)
def shared_http_client():
    import openai
    from openai._constants import DEFAULT_CONNECTION_LIMITS

    # every episode holds a connection while its turn generates: no limit on their number (openai's default is 1000)
    limits = type(DEFAULT_CONNECTION_LIMITS)(max_connections=None, max_keepalive_connections=256)
    return openai.DefaultHttpxClient(limits=limits)


def import_entry_point(path: str) -> Callable:
    """The harness function ``module:function``, looked up from the working directory too (an agent beside the
    run's configs, ``examples.agents.calculator_agent:run_episode``, as ``python -m`` would find it)."""
    from ...tools.registry import import_function

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    return import_function(path, "harness entry point")


def command_line(command: str) -> str:
    """``command`` with ``{python}`` replaced by this run's interpreter (quoted)."""
    return command.replace("{python}", shlex.quote(sys.executable))


Exited = Callable[[Optional[str]], None]  # called once with None (a clean end) or what went wrong


class SharedProcess:
    """One process of the command for every episode: each task a JSON line on its standard input."""

    def __init__(self, command: str, environment: Dict[str, str], output) -> None:
        self.command, self.environment, self.output = command, environment, output
        self.proc: Optional[subprocess.Popen] = None
        self.open: Dict[str, Exited] = {}  # its episodes not ended
        self._lock = threading.Lock()

    def send(self, task: EpisodeTask, exited: Exited) -> None:
        line = (json.dumps(asdict(task)) + "\n").encode()
        with self._lock:
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
                assert self.proc is not None and self.proc.stdin is not None
                self.open[task.episode_id] = exited
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
                return
            except OSError as exc:
                self.open.pop(task.episode_id, None)
                error = f"the shared harness cannot take it: {first_line(exc)}"
        exited(error)

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            command_line(self.command),
            shell=True,
            stdin=subprocess.PIPE,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            env=self.environment,
            start_new_session=True,
        )
        threading.Thread(target=self._watch, args=(self.proc,), name="shared-harness", daemon=True).start()

    def _watch(self, proc: subprocess.Popen) -> None:
        code = proc.wait()
        with self._lock:
            ended, self.open = (self.open, {}) if proc is self.proc else ({}, self.open)
        for exited in ended.values():
            exited(f"the shared harness exited with code {code}")

    def done(self, episode_id: str) -> None:
        with self._lock:
            self.open.pop(episode_id, None)

    def close(self) -> None:
        with self._lock:
            proc, self.open = self.proc, {}
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class Harness:
    def __init__(
        self, entry_point: str, command: str, log_path: Optional[str], grace_s: float, shared_url: str = ""
    ) -> None:
        """``shared_url``: the endpoint's base URL for a command run once for all episodes (empty: per episode)."""
        self.entry_point, self.command, self.log_path, self.grace_s = entry_point, command, log_path, grace_s
        self.shared_url = shared_url
        self._shared: Optional[SharedProcess] = None
        self._function: Optional[Callable] = None
        self._processes: Dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._log: Optional[Any] = None  # the command's output file, opened with the first command

    def function(self) -> Callable:
        if self._function is None:
            self._function = import_entry_point(self.entry_point)
        return self._function

    def start(self, task: EpisodeTask, exited: Exited, reward: Callable[[Any], None]) -> None:
        if self.entry_point:
            threading.Thread(
                target=self._call, args=(task, exited, reward), name=f"harness-{task.episode_id}", daemon=True
            ).start()
        elif self.shared_url:
            with self._lock:
                if self._shared is None:
                    environment = {**os.environ, "OPENAI_BASE_URL": self.shared_url, "OPENAI_API_KEY": task.api_key}
                    self._shared = SharedProcess(self.command, environment, self._output())
            self._shared.send(task, exited)
        else:
            self._spawn(task, exited)

    def _call(self, task: EpisodeTask, exited: Exited, reward: Callable[[Any], None]) -> None:
        try:
            value = self.function()(task)
            if value is not None:
                reward(value)
        except Exception as exc:  # the user's code: whatever it raises drops its episode, not the run
            exited(f"{type(exc).__name__}: {first_line(exc)}")
            return
        exited(None)

    def _environment(self, task: EpisodeTask) -> Dict[str, str]:
        return {
            **os.environ,
            "OPENAI_BASE_URL": task.base_url,
            "OPENAI_API_KEY": task.api_key,
            "MINDSPEED_RL_EPISODE_ID": task.episode_id,
        }

    def _output(self):
        """Where a command's output goes: the run's harness.log (opened once), or nowhere."""
        if self._log is None and self.log_path:
            os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
            self._log = open(self.log_path, "ab")
        return self._log if self._log is not None else subprocess.DEVNULL

    def _spawn(self, task: EpisodeTask, exited: Exited) -> None:
        with self._lock:
            out = self._output()
        try:
            proc = subprocess.Popen(
                command_line(self.command),
                shell=True,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._environment(task),
                start_new_session=True,
            )
        except OSError as exc:
            exited(f"cannot start {self.command!r}: {first_line(exc)}")
            return
        with self._lock:
            self._processes[task.episode_id] = proc
        threading.Thread(target=self._watch, args=(task, proc, exited), daemon=True).start()

    def _watch(self, task: EpisodeTask, proc: subprocess.Popen, exited: Exited) -> None:
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(asdict(task)).encode())
            proc.stdin.close()
        except OSError:
            pass  # it exited before reading: its exit code says why
        code = proc.wait()
        with self._lock:
            self._processes.pop(task.episode_id, None)
        exited(None if code == 0 else f"exit code {code}")

    def stop(self, episode_id: str) -> None:
        """The episode has ended: its process gets ``grace_s`` to exit, then is killed (an entry point's thread
        finds its episode gone at its next request)."""
        if self._shared is not None:
            self._shared.done(episode_id)
        with self._lock:
            proc = self._processes.get(episode_id)
        if proc is not None:
            threading.Thread(target=self._kill_later, args=(proc, self.grace_s), daemon=True).start()

    @staticmethod
    def _kill_later(proc: subprocess.Popen, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        try:  # its whole group, even after the shell exited: a tool server it started must not outlive it
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()
        with self._lock:
            procs = list(self._processes.values())
        for proc in procs:
            self._kill_later(proc, 0.0)
        if self._log is not None:
            self._log.close()
            self._log = None
