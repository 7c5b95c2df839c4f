"""The run report's evaluation panels (eval_config): per suite, pass@k and maj@k against the iteration."""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

EVAL_KEY = re.compile(r"^eval/(?P<suite>.+)/(?P<metric>pass|maj)@(?P<k>\d+)$")


def eval_series(rows: List[Dict[str, float]]) -> Dict[str, Dict[str, List[Tuple[int, float]]]]:
    """suite -> "pass@k" / "maj@k" -> [(iteration evaluated, value)], in the order logged (an own engine's results
    come in later: ``eval/iteration`` names the iteration they evaluated)."""
    out: Dict[str, Dict[str, List[Tuple[int, float]]]] = {}
    for row in rows:
        at = int(row.get("eval/iteration", row["iteration"]))
        for key, value in row.items():
            match = EVAL_KEY.match(key)
            if match:
                out.setdefault(match["suite"], {}).setdefault(f"{match['metric']}@{match['k']}", []).append((at, value))
    return out


def evaluation_figures(rows: List[Dict[str, float]], png) -> List[Tuple[str, str]]:
    """(title, base64 PNG) per evaluated suite; ``png`` turns a figure into base64."""
    series = eval_series(rows)
    if not series:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = []
    for suite, curves in series.items():
        fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=90)
        ks = sorted({int(n.split("@")[1]) for n in curves})
        for name in sorted(curves, key=lambda n: (n.split("@")[0] != "pass", int(n.split("@")[1]))):
            points, k = curves[name], int(name.split("@")[1])
            style = "-" if name.startswith("pass") else "--"  # pass@k solid, maj@k dashed, one colour per k
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                style,
                color=f"C{ks.index(k) % 10}",
                marker="o",
                markersize=3,
                label=name,
            )
        ax.set_title(f"Evaluation: {suite}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("share of problems")
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        out.append((f"Evaluation: {suite}", png(fig)))
        plt.close(fig)
    return out
