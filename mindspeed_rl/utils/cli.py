"""Shared command-line behaviour: a user error prints one clear line and exits 2."""

from __future__ import annotations

import functools
import sys
from typing import Callable, Optional, Sequence

from ..config_cls.base import ConfigError

USER_ERROR_EXIT = 2


class UserError(Exception):
    """Bad input from the user (a file, a flag, a row): reported without a traceback."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop like Ctrl-C (clean-up runs), exit code 143."""


TERMINATED_EXIT = 143


def raise_terminated(signum, frame):
    raise Terminated()


def report_user_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a CLI ``main(argv) -> int``: ConfigError/UserError -> message on stderr, exit code 2."""

    @functools.wraps(main)
    def wrapper(argv: Optional[Sequence[str]] = None) -> int:
        try:
            return main(argv)
        except ConfigError as exc:
            print(f"config error: {exc}", file=sys.stderr)
            return USER_ERROR_EXIT
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return USER_ERROR_EXIT
        except Terminated:
            print("stopped by SIGTERM", file=sys.stderr)
            return TERMINATED_EXIT
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper
