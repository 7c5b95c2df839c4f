"""Checks on a YAML file before any YAML library builds it: a config is small text, not a way to exhaust memory.

PyYAML, OmegaConf and Hydra build a file's whole tree, recursively and with aliases expanded, so a 1 KB alias
bomb ("billion laughs") grows to the memory limit and 20,000 nested brackets end in a RecursionError. Each
YAML file a run reads goes through ``check_yaml_file`` first (the Hydra-composed config and its defaults, a
model file, configs/envs/runtime_env.yaml, a dataset config); text that reaches a YAML parser another way
(a dataset override's value) through ``check_yaml_text``. The check walks the parser's event stream, which
keeps no tree and needs no recursion, and stops at the first limit passed.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .base import ConfigError

MAX_BYTES = 1024 * 1024  # 1 MiB: the shipped configs are under 10 KB
MAX_DEPTH = 32  # nested mappings and lists (OmegaConf recurses ~10 frames a level); the shipped configs nest 4
MAX_ALIAS_NODES = 10_000  # nodes that aliases (*name, <<: *name) add when expanded, in all


def check_yaml_file(path: str) -> str:
    """The text of the YAML file ``path``, refused (ConfigError naming the file) when it is over MAX_BYTES,
    not UTF-8, not valid YAML, not a mapping at the top level, nested deeper than MAX_DEPTH or when its
    aliases expand to more than MAX_ALIAS_NODES nodes."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_BYTES:
        size = os.path.getsize(path) if os.path.isfile(path) else len(raw)
        raise ConfigError(path, f"is {size:,} bytes, over the limit of {MAX_BYTES:,} bytes (1 MiB) for a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            path, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}, column {column}); save it as UTF-8"
        ) from None
    check_yaml_text(text, path, mapping=True)
    return text


def check_yaml_text(text: str, where: str, mapping: bool = False) -> None:
    """Refuse (ConfigError naming ``where``) YAML text that is over MAX_BYTES, not valid YAML, nested deeper
    than MAX_DEPTH or whose aliases expand to more than MAX_ALIAS_NODES nodes. ``mapping``: it must also be
    a mapping at the top level (or empty): OmegaConf parses a top-level string once more, as YAML."""
    import yaml

    if len(text) > MAX_BYTES:
        raise ConfigError(where, f"is {len(text):,} characters, over the limit of {MAX_BYTES:,} (1 MiB)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when installed: 20x faster
    sizes: Dict[str, int] = {}  # anchor -> nodes it stands for, aliases in it expanded
    open_nodes: List[List] = []  # [anchor, nodes so far] of each mapping or list not yet closed
    alias_nodes, top_seen = 0, False

    def add(size: int) -> None:
        if open_nodes:
            open_nodes[-1][1] += size

    try:
        for event in yaml.parse(text, Loader=loader):
            if not top_seen and isinstance(event, yaml.NodeEvent):
                top_seen = True
                if mapping and not isinstance(event, yaml.MappingStartEvent):
                    what = "a list" if isinstance(event, yaml.SequenceStartEvent) else "a single value"
                    raise ConfigError(_at(where, event), f"must be a mapping of keys at the top level, not {what}")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                open_nodes.append([event.anchor, 1])
                if len(open_nodes) > MAX_DEPTH:
                    raise ConfigError(
                        _at(where, event), f"is nested more than {MAX_DEPTH} levels deep (mappings and lists)"
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, size = open_nodes.pop()
                if anchor is not None:
                    sizes[anchor] = size
                add(size)
            elif isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    sizes[event.anchor] = 1
                add(1)
            elif isinstance(event, yaml.AliasEvent):
                size = sizes.get(event.anchor or "", 1)
                alias_nodes += size
                if alias_nodes > MAX_ALIAS_NODES:
                    raise ConfigError(
                        _at(where, event),
                        f"aliases (*{event.anchor} and the ones before) expand to more than {MAX_ALIAS_NODES:,} "
                        "nodes; write the values out or use fewer aliases",
                    )
                add(size)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where_exactly = f"{where}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else where
        raise ConfigError(where_exactly, f"is not valid YAML: {getattr(exc, 'problem', None) or exc}") from None


def _at(where: str, event) -> str:
    mark = event.start_mark
    return f"{where}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else where


# ----- interpolations ----------------------------------------------------------------------------------------
INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")
MAX_RESOLVED = 8 * MAX_BYTES  # nodes plus characters of a config with every interpolation resolved


def _children(value: Any, path: Tuple[str, ...]) -> Iterator[Tuple[Tuple[str, ...], Any]]:
    if isinstance(value, dict):
        yield from ((path + (str(k),), v) for k, v in value.items())
    elif isinstance(value, list):
        yield from ((path + (str(i),), v) for i, v in enumerate(value))


def _target(reference: str, path: Tuple[str, ...]) -> Optional[Tuple[str, ...]]:
    """The node path a ``${reference}`` in the node at ``path`` names (None: a resolver such as oc.env)."""
    if ":" in reference:
        return None
    dots = len(reference) - len(reference.lstrip("."))
    rest = tuple(part for part in reference[dots:].split(".") if part)
    return (path[:-dots] if dots else ()) + rest


def check_interpolations(data: Any, where: str) -> None:
    """Refuse (ConfigError naming the key) an unresolved config whose ``${...}`` interpolations would resolve
    to more than MAX_RESOLVED nodes and characters (each level of "a2: [${a1}, ${a1}, ...]" multiplies the
    size: a few lines resolve to gigabytes), or that form a cycle. Iterative: no recursion, whatever the
    chain's length."""
    nodes: Dict[Tuple[str, ...], Any] = {}
    pending: List[Tuple[Tuple[str, ...], Any]] = [((), data)]
    while pending:
        path, value = pending.pop()
        nodes[path] = value
        pending.extend(_children(value, path))
    if not any(isinstance(v, str) and "${" in v for v in nodes.values()):
        return
    size: Dict[Tuple[str, ...], int] = {}
    on_path: set = set()

    def parts(path: Tuple[str, ...]) -> Tuple[int, List[Tuple[str, ...]]]:
        """(own size, the nodes its size adds up)."""
        value = nodes[path]
        if isinstance(value, (dict, list)):
            return 1, [child for child, _ in _children(value, path)]
        if not isinstance(value, str) or "${" not in value:
            return len(str(value)), []
        targets = [_target(ref, path) for ref in INTERPOLATION.findall(value)]
        own = len(INTERPOLATION.sub("", value)) + sum(1 for t in targets if t is None or t not in nodes)
        return own, [t for t in targets if t is not None and t in nodes]

    for root in nodes:
        stack = [root]
        while stack:
            path = stack[-1]
            if path in size:
                stack.pop()
                continue
            own, deps = parts(path)
            if path not in on_path:
                on_path.add(path)
                todo = [d for d in deps if d not in size]
                for dep in todo:
                    if dep in on_path:
                        raise ConfigError(".".join(path) or where, f"interpolation cycle through {'.'.join(dep)}")
                if todo:
                    stack.extend(todo)
                    continue
            total = own + sum(size[d] for d in deps)
            if total > MAX_RESOLVED:
                raise ConfigError(
                    ".".join(path) or where,
                    f"its interpolations (${{...}}) resolve to more than {MAX_RESOLVED:,} nodes and characters "
                    f"({where}); write the values out",
                )
            size[path] = total
            on_path.discard(path)
            stack.pop()


def load_yaml(path: str) -> Any:
    """Read a YAML file the way Hydra does (OmegaConf's loader: '1e-6' is a float), after the checks of
    ``check_yaml_file`` (size, UTF-8, nesting, aliases) and ``check_interpolations``."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    stream = io.StringIO(check_yaml_file(path))
    stream.name = path  # YAML error marks name the file
    try:
        conf = OmegaConf.load(stream)
        check_interpolations(OmegaConf.to_container(conf, resolve=False), path)
        return OmegaConf.to_container(conf, resolve=True)
    except YAMLError as exc:
        raise yaml_error(exc, path) from None
    except OmegaConfBaseException as exc:
        raise ConfigError(path, f"cannot resolve: {str(exc).splitlines()[0]}") from None


def yaml_error(exc: Exception, path: str) -> ConfigError:
    """A YAML syntax error as a ConfigError naming the file, line and column."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else path
    return ConfigError(where, f"is not valid YAML: {getattr(exc, 'problem', None) or exc}")
