"""Shared command-line behaviour: a user error prints one clear line and exits 2; SIGTERM exits 143; SIGUSR1 prints
every thread's Python stack to stderr (where a run that seems hung waits)."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import signal
import sys
import threading
from typing import Callable, Iterator, Optional, Sequence

from ..config_cls.base import ConfigError

USER_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130
TERMINATED_EXIT = 143


class UserError(Exception):
    """Bad input from the user (a file, a flag, a row): reported without a traceback."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop like Ctrl-C (clean-up runs), exit code 143."""


# Whether this process has received SIGTERM. The exception alone cannot tell: Ray's blocking calls (ray.get,
# ray.wait) catch any KeyboardInterrupt a signal handler raises inside them and raise a new, plain one.
_sigterm = {"received": False}


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message as one line of a report: its first line (its type where it has none), at most ``limit``
    characters."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


def raise_terminated(signum, frame):
    _sigterm["received"] = True
    raise Terminated()


def stopped_by_sigterm(exc: KeyboardInterrupt) -> bool:
    """Whether ``exc`` (Ctrl-C or SIGTERM, whatever a library made of it) ends the process for a SIGTERM."""
    return isinstance(exc, Terminated) or _sigterm["received"]


def interrupt_exit_code(exc: KeyboardInterrupt) -> int:
    """143 for a SIGTERM, 130 for Ctrl-C."""
    return TERMINATED_EXIT if stopped_by_sigterm(exc) else INTERRUPTED_EXIT


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` in the main thread inside the block; the previous handler is restored
    after it. The outermost block starts with no SIGTERM recorded. Outside the main thread: nothing.

    Python runs a signal handler wherever the main thread is, a ``__del__`` that garbage collection called
    included, and drops what is raised there: such a ``Terminated`` is dropped without its "Exception ignored"
    traceback, and ``raise_if_terminated`` raises it again at the caller's next safe point."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    if previous is not raise_terminated:
        _sigterm["received"] = False
    previous_hook = sys.unraisablehook

    def unraisable(info):
        if not isinstance(info.exc_value, Terminated):
            previous_hook(info)

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook


def raise_if_terminated() -> None:
    """Raise ``Terminated`` when a SIGTERM arrived inside a ``stop_on_sigterm`` block but its exception was
    dropped (raised in a ``__del__``): called between a run's start-up phases and iterations."""
    if _sigterm["received"] and signal.getsignal(signal.SIGTERM) is raise_terminated:
        raise Terminated()


def dump_stacks_on_sigusr1() -> None:
    """SIGUSR1 prints every thread's Python stack on the process's own stderr (fd 2, whatever replaced
    ``sys.stderr``: a test's capture has no file descriptor); nothing where there is no SIGUSR1 (Windows) or no
    stderr."""
    if hasattr(signal, "SIGUSR1") and sys.__stderr__ is not None:
        with contextlib.suppress(OSError, ValueError):  # a stderr without a descriptor (an embedding host)
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True, chain=False)


def report_user_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a CLI ``main(argv) -> int``: ConfigError/UserError -> message on stderr, exit code 2; Ctrl-C 130;
    SIGTERM 143 (when the CLI handles it with ``stop_on_sigterm``); SIGUSR1 dumps the threads' stacks."""

    @functools.wraps(main)
    def wrapper(argv: Optional[Sequence[str]] = None) -> int:
        dump_stacks_on_sigusr1()
        try:
            return main(argv)
        except ConfigError as exc:
            print(f"config error: {exc}", file=sys.stderr)
            return USER_ERROR_EXIT
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return USER_ERROR_EXIT
        except KeyboardInterrupt as exc:
            code = interrupt_exit_code(exc)
            print("stopped by SIGTERM" if code == TERMINATED_EXIT else "interrupted", file=sys.stderr)
            return code

    return wrapper


def parse_run_args(argv: Optional[Sequence[str]], description: Optional[str]) -> argparse.Namespace:
    """The options of the training entry points (cli/train_ppo.py, cli/train_rm.py)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config-name",
        required=True,
        help="config under configs/ (e.g. ppo_qwen25_32b_A3, rm_tiny_cpu) or a path to a YAML file",
    )
    parser.add_argument(
        "--config-dir",
        "--config-path",
        dest="config_dir",
        default=None,
        help="folder to look the config name up in (default: the project's configs/)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config and its paths as a real run would, start nothing (exit 0 or 2)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: section.key=value")
    return parser.parse_args(argv)


def validated_only(dry_run: bool, check: bool, problems: Sequence[ConfigError]) -> bool:
    """What the training entry points do once the config is valid, before anything heavy: with ``dry_run`` the
    missing paths are warnings and nothing starts (True); else every problem is said and the first raised (exit
    2); with ``check`` nothing starts either (True). False: start the run."""
    if dry_run:
        for problem in problems:
            print(f"warning: {problem} (a real run stops here)")
        print("dry_run: the config is valid; nothing was started.")
        return True
    if problems:
        for problem in problems[1:]:
            print(f"config error: {problem}", file=sys.stderr)
        raise problems[0]
    if check:
        print("check: the config and its paths are valid; nothing was started.")
        return True
    return False
