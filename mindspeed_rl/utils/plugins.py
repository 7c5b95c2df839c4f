"""The one loader of plug-ins named by path in a config: verifiers, tools and rollout functions.

A path is ``package.module:name`` (or ``package.module.name`` where the caller allows the dotted form); the
module must be importable from the run's working folder or PYTHONPATH. Each caller words its own error around
the reason this loader gives.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Tuple


class PluginImportError(ValueError):
    """A plug-in path that does not give a callable; the message says why. ``imported`` is False when the
    module or the name could not be imported, True when the object was found but is not callable."""

    def __init__(self, message: str, imported: bool = False):
        super().__init__(message)
        self.imported = imported


def split_path(path: str, dotted: bool = True) -> Tuple[str, str]:
    """``module:name`` (or, with ``dotted``, ``module.name``) -> (module, name)."""
    module, sep, attr = path.partition(":")
    if not sep and dotted:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise PluginImportError(f"{path!r}: expected 'module:function'")
    return module, attr


def import_named(path: str) -> Any:
    """What a path the package names itself (``module:name``: a family's layer spec, a stage's classes) points to;
    an error propagates as raised, with its traceback (unlike a user's plug-in, a failure here is a broken install)."""
    module, attr = split_path(path, dotted=False)
    return getattr(importlib.import_module(module), attr)


def import_callable(path: str, dotted: bool = True) -> Callable[..., Any]:
    """The callable a plug-in path names; PluginImportError says what failed: the module cannot be imported,
    raised while importing, has no such name, or the name is not callable."""
    module, attr = split_path(path, dotted)
    try:
        found = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise PluginImportError(
            f"cannot import {module!r} ({type(exc).__name__}: {exc}); the module must be "
            "importable from the run's working folder or PYTHONPATH"
        ) from None
    except AttributeError:
        raise PluginImportError(f"module {module!r} has no {attr!r}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        raise PluginImportError(f"importing {module!r} raised {type(exc).__name__}: {exc}") from None
    if not callable(found):
        raise PluginImportError(f"{attr!r} is not a function but a {type(found).__name__}", imported=True)
    return found
