"""Name -> verifier function. A verifier maps (response text, label) to a score (in [0, 1], or [-1, 1] for
acc_for_dapo).

A name in ``rl_config.verifier_function`` is a built-in (``verifiers.py``), a name a module registered with
``@register_verifier``, or a plug-in by path, ``package.module:function``, imported where it is used (the
driver's config check and each reward worker), so a user's verifier needs no edit of this package.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

from ..utils.plugins import PluginImportError, import_callable
from . import verifiers

Verifier = Callable[[str, str], float]
BUILTIN: Dict[str, Verifier] = {
    "acc_for_ppo": verifiers.accuracy,
    "base_acc": verifiers.accuracy,
    "gsm8k": verifiers.accuracy,
    "math": verifiers.accuracy,
    "acc_for_dapo": verifiers.accuracy_plus_minus,
    "format": verifiers.format_reward,
    "strict_format": verifiers.strict_format_reward,
    "reasoning_gym": verifiers.reasoning_gym_score,  # the task's own scorer (cli/reasoning_gym_tasks.py's labels)
}
_REGISTRY: Dict[str, Verifier] = dict(BUILTIN)
# the final answer a verifier reads from a response (maj@k's votes); the others read verifiers.extract_answer's
ANSWER_READERS: Dict[str, Callable[[str], Optional[str]]] = {"reasoning_gym": verifiers.tagged_answer}


class VerifierImportError(KeyError):
    """A ``module:function`` verifier that cannot be imported (the message says why)."""

    def __str__(self) -> str:
        return str(self.args[0])


def register_verifier(*names: str) -> Callable[[Verifier], Verifier]:
    def wrap(fn: Verifier) -> Verifier:
        for name in names:
            if name in _REGISTRY and _REGISTRY[name] is not fn:
                raise ValueError(f"verifier {name!r} is registered twice")
            _REGISTRY[name] = fn
        return fn

    return wrap


def known_verifiers() -> List[str]:
    return sorted(_REGISTRY)


def is_path(name: str) -> bool:
    return ":" in name


def import_verifier(path: str) -> Verifier:
    """``package.module:function`` -> the function (the shared plug-in loader); VerifierImportError says what
    failed."""
    try:
        return import_callable(path, dotted=False)
    except PluginImportError as exc:
        raise VerifierImportError(str(exc)) from None


def get_verifier(name: str) -> Verifier:
    if is_path(name):
        return import_verifier(name)
    if name not in _REGISTRY:
        raise KeyError(f"unknown verifier {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def answer_reader(name: str) -> Callable[[str], Optional[str]]:
    """How the verifier ``name`` finds a response's final answer (for votes: maj@k)."""
    return ANSWER_READERS.get(name, verifiers.extract_answer)
