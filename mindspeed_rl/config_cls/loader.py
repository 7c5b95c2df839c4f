"""Compose a run config with Hydra (defaults list, config groups) and apply CLI overrides.

``key=value`` overrides are parsed with Hydra's override grammar but applied here, after
composition, so that a key the YAML does not spell out (but the schema knows) can be set
without Hydra's ``+`` prefix, and an unknown key is reported by the schema validator with
its full path and the closest known key, not as a Hydra stack trace. Each YAML file Hydra composes, and
each override, passes the limits of ``yaml_guard`` first (size, nesting, aliases), and the composed config's
interpolations are sized before they are resolved.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .base import ConfigError
from .yaml_guard import MAX_BYTES, MAX_DEPTH, check_interpolations, check_yaml_file, yaml_error

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
GROUPS = ("model",)


def resolve_config_name(name: str, config_dir: Optional[str] = None) -> Tuple[str, str]:
    """``name`` may be a name under configs/ or a path to a YAML file. Returns (dir, name)."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        path = os.path.abspath(name)
        if not os.path.isfile(path):
            raise ConfigError("--config-name", f"file {name!r} does not exist")
        return os.path.dirname(path), os.path.splitext(os.path.basename(path))[0]
    config_dir = os.path.abspath(config_dir or CONFIG_DIR)
    path = os.path.join(config_dir, f"{name}.yaml")
    if not os.path.isfile(path):
        known = (
            sorted(f[:-5] for f in os.listdir(config_dir) if f.endswith(".yaml")) if os.path.isdir(config_dir) else []
        )
        from .base import closest_key

        hint = closest_key(name, known)
        raise ConfigError(
            "--config-name",
            f"no config {name!r} in {config_dir}"
            + (f"; did you mean {hint!r}?" if hint else f"; available: {', '.join(known)}"),
        )
    return config_dir, name


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _override_key(text: str) -> str:
    key = text.split("=", 1)[0].lstrip("+~") if "=" in text else text
    return key if len(key) <= 100 else key[:100] + "..."


def check_override(text: str) -> None:
    """Refuse an override Hydra's parser cannot take safely: longer than MAX_BYTES, or with brackets nested
    deeper than MAX_DEPTH (Hydra's parser and OmegaConf recurse per level: a RecursionError near 150 nested
    lists, or 75 nested mappings)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(
            _override_key(text), f"the override is {len(text):,} characters, over the limit of {MAX_BYTES:,}"
        )
    depth, quote, escaped = 0, None, False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(
                    _override_key(text), f"the override's value is nested more than {MAX_DEPTH} levels deep"
                )
        elif char in "]})":
            depth -= 1


def _parse_overrides(overrides: Sequence[str]) -> List[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        check_override(text)
        try:
            parsed.extend(parser.parse_overrides([text]))
        except OverrideParseException as exc:
            raise ConfigError(_override_key(text), f"cannot parse override {text!r}: {_first_line(exc)}") from None
    return parsed


@contextlib.contextmanager
def guarded_hydra_files() -> Iterator[None]:
    """While composing, every file Hydra reads from a folder (the primary config, the files of its defaults
    list, any ``hydra.searchpath`` folder) passes ``check_yaml_file`` first. Hydra reads them through the
    config source registered for ``file://`` and has no public hook before the YAML parser: that registry
    entry is swapped for a checking subclass and restored after."""
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    class GuardedFileConfigSource(FileConfigSource):
        def load_config(self, config_path: str) -> Any:
            check_yaml_file(os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path))))
            return super().load_config(config_path)

    Plugins.instance()  # registers Hydra's own sources first (it refuses a second class for "file")
    types = SourcesRegistry.instance().types
    previous = types.get("file", FileConfigSource)
    types["file"] = GuardedFileConfigSource
    try:
        yield
    finally:
        types["file"] = previous


def compose(config_name: str, overrides: Sequence[str] = (), config_dir: Optional[str] = None) -> Tuple[Dict, str]:
    """Compose ``config_name`` with ``overrides``; returns (plain dict, config dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    config_dir, name = resolve_config_name(config_name, config_dir)
    parsed = _parse_overrides(overrides)
    group_overrides = [
        o.input_line
        for o in parsed
        if o.key_or_group.split(".")[0] in GROUPS and not o.key_or_group.startswith("model.")
    ]
    value_overrides = [o for o in parsed if o.input_line not in group_overrides]
    GlobalHydra.instance().clear()
    try:
        with guarded_hydra_files(), initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = hydra_compose(config_name=name, overrides=group_overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(name, f"cannot compose config: {_first_line(exc)}") from None
    except YAMLError as exc:
        raise yaml_error(exc, name) from None
    finally:
        GlobalHydra.instance().clear()
    OmegaConf.set_struct(cfg, False)
    for o in value_overrides:
        key = o.key_or_group
        if o.is_sweep_override():
            raise ConfigError(
                key,
                f"{o.input_line!r} is a Hydra sweep (several values); runs take one value. "
                f"Quote a value that contains commas: {key}='\"a,b\"'",
            )
        try:
            if o.is_delete():
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(cfg, parent) if parent else cfg
                if node is None or leaf not in node:
                    raise ConfigError(key, "cannot delete: key is not in the config")
                node.pop(leaf)
            else:
                OmegaConf.update(cfg, key, o.value(), merge=True, force_add=True)
        except OmegaConfBaseException as exc:
            raise ConfigError(key, f"cannot apply override {o.input_line!r}: {_first_line(exc)}") from None
    check_interpolations(OmegaConf.to_container(cfg, resolve=False), name)
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(getattr(exc, "full_key", "") or name, f"cannot resolve: {_first_line(exc)}") from None
    data.pop("hydra", None)
    return data, config_dir
