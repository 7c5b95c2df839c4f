"""Typed config sections: one dataclass per YAML section, validated key by key.

Each field carries its documentation and rules in ``metadata`` (see :func:`opt`), so
validation, error messages and docs/config.md come from one place. Nothing here imports
torch: a bad config must be refused in well under a second.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Mapping, Optional

REQUIRED = dataclasses.MISSING


class ConfigError(ValueError):
    """A user error in the configuration; ``key`` is the full dotted path of the bad key."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


def opt(
    default: Any = REQUIRED,
    doc: str = "",
    *,
    choices: Optional[tuple] = None,
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    le: Optional[float] = None,
    lt: Optional[float] = None,
    factory: Optional[typing.Callable[[], Any]] = None,
) -> Any:
    """A documented config field with optional range/choice rules."""
    meta = {"doc": doc, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def closest_key(name: str, known: typing.Iterable[str]) -> Optional[str]:
    matches = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return matches[0] if matches else None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " (or null)"
    if origin in (list, tuple):
        (arg,) = typing.get_args(tp)[:1] or (Any,)
        return f"list of {_type_name(arg)}"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it (ints widened to float)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, key)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:  # Optional[X]: X's own error (a mapping names its key)
            raise errors[0]
        raise ConfigError(key, f"got {value!r}, expected {_type_name(tp)}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build_section(tp, value, key)
    if origin in (list, tuple):
        (arg,) = typing.get_args(tp)[:1] or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"got {value!r}, expected a list of {_type_name(arg)}")
        return [_convert(v, arg, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"got {value!r}, expected a mapping")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"got {value!r}, expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(key, f"got {value!r}, expected an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(key, f"got {value!r}, expected a finite number")
            return float(value)
        raise ConfigError(key, f"got {value!r}, expected a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(key, f"got {value!r}, expected a string")
    raise TypeError(f"unsupported annotation {tp!r} for {key}")


def _check_rules(value: Any, meta: Mapping[str, Any], key: str) -> None:
    if value is None:
        return
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        spelled = [yaml_spelling(c) for c in choices]
        hint = closest_key(str(value), spelled)
        extra = f"; did you mean {hint!r}?" if hint else ""
        raise ConfigError(key, f"got {value!r}, allowed: {', '.join(spelled)}{extra}")
    for rule, test, words in (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
        ("lt", lambda v, b: v < b, "<"),
    ):
        bound = meta.get(rule)
        if bound is not None and isinstance(value, (int, float)) and not test(value, bound):
            raise ConfigError(key, f"got {value!r}, must be {words} {bound}")


def yaml_spelling(value: Any) -> str:
    """A choice as YAML writes it (true / false for booleans)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def build_section(cls: type, data: Any, path: str, *, require: bool = True) -> Any:
    """Build dataclass ``cls`` from mapping ``data``; errors name the key path ``path.key``.

    ``require=False`` fills missing required fields with None (for partial sections that
    are merged later, such as role overrides of megatron_training).
    """
    if data is None:
        raise ConfigError(path, "is null; give the section's keys, or leave it out to use its defaults")
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"must be a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = field_names(cls)
    for key in data:
        if key not in known:
            hint = closest_key(str(key), known)
            extra = f"; did you mean '{_join(path, hint)}'?" if hint else f"; known keys: {', '.join(known)}"
            raise ConfigError(_join(path, str(key)), f"unknown key{extra}")
    values = {}
    for f in dataclasses.fields(cls):
        key = _join(path, f.name)
        if f.name in data:
            value = _convert(data[f.name], hints[f.name], key)
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        elif require:
            raise ConfigError(key, "required key is missing")
        else:
            value = None
        _check_rules(value, f.metadata, key)
        values[f.name] = value
    obj = cls(**values)
    obj._path = path
    if isinstance(obj, SelfChecking):  # the section's rules across its own keys, named from ``path``
        obj.check(path, set(data))
    return obj


@typing.runtime_checkable
class SelfChecking(typing.Protocol):
    """A section with rules across its own keys: ``check(path, given)`` raises ConfigError naming the full key
    path (``given``: the keys the config sets); ``build_section`` calls it."""

    def check(self, path: str, given: typing.AbstractSet[str]) -> None: ...
