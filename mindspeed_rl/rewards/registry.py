"""Name -> verifier function. A verifier maps (response text, label) to a score (in [0, 1], or [-1, 1] for
acc_for_dapo)."""
from __future__ import annotations

from typing import Callable, Dict, List

Verifier = Callable[[str, str], float]
_REGISTRY: Dict[str, Verifier] = {}


def register_verifier(*names: str) -> Callable[[Verifier], Verifier]:
    def wrap(fn: Verifier) -> Verifier:
        for name in names:
            if name in _REGISTRY and _REGISTRY[name] is not fn:
                raise ValueError(f"verifier {name!r} is registered twice")
            _REGISTRY[name] = fn
        return fn
    return wrap


def _load_builtin() -> None:
    from . import verifiers  # noqa: F401  (registers on import)


def known_verifiers() -> List[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_verifier(name: str) -> Verifier:
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown verifier {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
