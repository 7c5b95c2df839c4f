"""The run report's HTML page (``report.py`` gathers its pieces): one self-contained file, its style inline and
its images embedded as base64 PNG. Plain string building; a leaf that imports nothing of the project."""

from __future__ import annotations

import html
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f4f4f4;font-weight:600}pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:1em}img{max-width:100%}"""


def table(rows: List[Tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def operator_table(title: str, operators: List[Dict[str, Any]]) -> str:
    head = "<tr><th>operator</th><th>calls</th><th>self ms</th></tr>"
    body = "".join(
        f"<tr><td>{html.escape(op['name'])}</td><td>{op['calls']}</td><td>{op['self_ms']:.3f}</td></tr>"
        for op in operators
    )
    return f"<h3>{html.escape(title)}</h3><table>{head}{body}</table>"


def page(
    run_dir: str,
    info: Dict[str, Any],
    iterations: int,
    final: List[Tuple[str, str]],
    summary: Optional[List[Tuple[str, str]]],
    plots: List[Tuple[str, str]],
    profiles: Sequence[Tuple[str, List[Dict[str, Any]]]] = (),
) -> str:
    """The whole page. ``info``: run.json (started, command, batch plan, config as given); ``iterations``:
    how many were logged; ``final`` and ``summary`` (None without a resolved config): (label, value) rows;
    ``plots``: (title, base64 PNG); ``profiles``: (title, top operators) per profiled stage."""
    config = info.get("config") or {}
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mindspeed_rl run report: "
        f"{html.escape(os.path.basename(os.path.abspath(run_dir)))}</title><style>{STYLE}</style></head><body>",
        f"<h1>Run report</h1><p>{html.escape(os.path.abspath(run_dir))}"
        + (f" &middot; started {html.escape(info['started'])}" if info.get("started") else "")
        + f" &middot; {iterations} iteration(s) logged</p>",
    ]
    if info.get("command"):
        parts.append(f"<pre>{html.escape(' '.join(info['command']))}</pre>")
    parts.append("<h2>Final numbers</h2>" + (table(final) or "<p>no iteration finished</p>"))
    if summary is not None:
        parts.append("<h2>Config summary</h2>" + table(summary))
    if info.get("batch_plan"):
        parts.append(f"<h2>Batch plan</h2><pre>{html.escape(info['batch_plan'])}</pre>")
    if plots:
        parts.append(
            "<h2>Curves</h2><div class='grid'>"
            + "".join(
                f"<figure><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'></figure>"
                for title, data in plots
            )
            + "</div>"
        )
    if profiles:
        parts.append(
            "<h2>Profiler: top operators per stage</h2>" + "".join(operator_table(t, ops) for t, ops in profiles)
        )
    if config:
        parts.append(
            "<details><summary>Config as given (YAML and overrides)</summary><pre>"
            + html.escape(json.dumps(config, indent=1, default=str))
            + "</pre></details>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)
