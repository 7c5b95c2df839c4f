"""An evaluation's results: a table on the console, results.json, and a PNG per suite (pass@k and maj@k against
k; the response lengths)."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence


def table(results: Dict[str, Dict[str, float]], ks: Sequence[int]) -> str:
    """One row per suite: problems, mean@n, pass@k and maj@k for each k, mean length, truncation rate."""
    keys: List[str] = ["problems"]
    if results:
        keys.append(next(k for k in next(iter(results.values())) if k.startswith("mean@")))
    keys += [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in ks] + ["response_length/mean", "truncated/rate"]
    heads = ["suite"] + [
        k.replace("response_length/mean", "length").replace("truncated/rate", "truncated") for k in keys
    ]
    rows = [[name] + [_cell(key, m.get(key, float("nan"))) for key in keys] for name, m in results.items()]
    widths = [max(len(str(r[i])) for r in [heads] + rows) for i in range(len(heads))]

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _cell(key: str, value: float) -> str:
    if key == "problems":
        return str(int(value))
    if key == "response_length/mean":
        return f"{value:.1f}"
    return f"{value:.3f}"


def write_json(path: str, payload: dict) -> None:
    """Written under a temporary name and renamed: never half a file under ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".part", "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2)
    os.replace(path + ".part", path)


def draw_suite(path: str, name: str, metrics: Dict[str, float], ks: Sequence[int], lengths: Sequence[int]) -> str:
    """``path``: pass@k and maj@k against k (left), the histogram of response lengths (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6), dpi=100)
    left.plot(list(ks), [metrics[f"pass@{k}"] for k in ks], marker="o", label="pass@k")
    left.plot(list(ks), [metrics[f"maj@{k}"] for k in ks], marker="s", label="maj@k")
    left.set_xscale("log", base=2)
    left.set_xticks(list(ks), [str(k) for k in ks])
    left.set_ylim(-0.02, 1.02)
    left.set_xlabel("k (samples)")
    left.set_ylabel("share of problems")
    left.set_title(f"{name}: pass@k and maj@k")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    right.hist(list(lengths), bins=30, color="tab:gray")
    right.set_xlabel("response tokens")
    right.set_ylabel("samples")
    right.set_title(f"{name}: response length (truncated {metrics['truncated/rate']:.1%})")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path + ".part.png")
    plt.close(fig)
    os.replace(path + ".part.png", path)
    return path
