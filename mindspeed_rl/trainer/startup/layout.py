"""Which ranks do what: rollout engines (blocks of infer-TP actor ranks, as vLLM splits the world) and
train data-parallel groups (megatron's order: TP fastest, then CP, then DP, then PP), as lists and as a diagram."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple


def engine_blocks(world: int, infer_tp: int) -> List[List[int]]:
    """Ranks of each rollout engine: contiguous blocks of ``infer_tp`` ranks."""
    return [list(range(start, start + infer_tp)) for start in range(0, world, infer_tp)]


def dp_groups(tp: int, dp: int, pp: int, cp: int = 1) -> List[List[int]]:
    """Ranks of each data-parallel group (its TP x CP x PP ranks: one copy of the data)."""
    return [
        sorted(t + tp * (c + cp * (d + dp * p)) for p in range(pp) for c in range(cp) for t in range(tp))
        for d in range(dp)
    ]


def cp_groups(tp: int, dp: int, pp: int, cp: int) -> List[List[int]]:
    """Ranks of each context-parallel group (they split one sequence)."""
    return [
        [t + tp * (c + cp * (d + dp * p)) for c in range(cp)] for p in range(pp) for d in range(dp) for t in range(tp)
    ]


def train_coordinates(rank: int, tp: int, dp: int, cp: int = 1) -> Tuple[int, int, int]:
    """(tp_rank, dp_rank, pp_rank) of ``rank``."""
    return rank % tp, (rank // (tp * cp)) % dp, rank // (tp * cp * dp)


def describe_blocks(blocks: Sequence[Sequence[int]], name: str, shown: int = 4) -> str:
    """'engine 0 = [0-7], engine 1 = [8-15], ...' (the first few blocks, then how many more)."""

    def span(ranks: Sequence[int]) -> str:
        contiguous = list(ranks) == list(range(ranks[0], ranks[0] + len(ranks)))
        return f"[{ranks[0]}-{ranks[-1]}]" if contiguous and len(ranks) > 2 else str(list(ranks))

    text = ", ".join(f"{name} {i} = {span(b)}" for i, b in enumerate(blocks[:shown]))
    return text + (f", ... ({len(blocks)} in all)" if len(blocks) > shown else "")


def layout_diagram(world: int, infer_tp: int, roles: Sequence[Tuple], max_columns: int = 8) -> str:
    """A text picture of ranks -> engines -> DP groups. ``roles``: (name, tp, dp, pp[, cp]) of each Megatron
    role on these ranks. Adjacent ranks with the same engine and DP/PP/CP place share a column."""
    roles = [tuple(r) + (1,) * (5 - len(r)) for r in roles]

    def labels(rank: int) -> List[str]:
        row = [f"engine {rank // infer_tp}"]
        for _, tp, dp, pp, cp in roles:
            _, d, p = train_coordinates(rank, tp, dp, cp)
            c = (rank // tp) % cp
            row.append(f"DP {d}" + (f" PP {p}" if pp > 1 else "") + (f" CP {c}" if cp > 1 else ""))
        return row

    segments: List[Tuple[int, int, List[str]]] = []
    for rank in range(world):
        here = labels(rank)
        if segments and segments[-1][2] == here:
            segments[-1] = (segments[-1][0], rank, here)
        else:
            segments.append((rank, rank, here))
    hidden: Optional[int] = None
    if len(segments) > max_columns:
        hidden = len(segments) - max_columns + 1
        segments = segments[: max_columns - 1] + [segments[-1]]
    work = {"actor": "train", "critic": "train"}  # the frozen roles (reward model, teacher) only run forwards
    heads = ["ranks", "rollout"] + [f"{name} {work.get(name, 'forward')}" for name, *_ in roles]
    notes = [f"{world} rank(s)", f"infer TP {infer_tp}: each engine's ranks run one vLLM instance on the same prompts"]
    notes += [
        f"TP {tp} x PP {pp}" + (f" x CP {cp}" if cp > 1 else "") + " ranks per DP group" for _, tp, _, pp, cp in roles
    ]
    cells = [[f"{a}" if a == b else f"{a}-{b}" for a, b, _ in segments]]
    cells += [[seg[2][row] for seg in segments] for row in range(1 + len(roles))]
    widths = [max(len(cells[r][c]) for r in range(len(cells))) for c in range(len(segments))]
    head_width = max(len(h) for h in heads)
    lines = []
    for head, row, note in zip(heads, cells, notes):
        body = " | ".join(cell.ljust(w) for cell, w in zip(row, widths))
        if hidden:
            parts = body.rsplit(" | ", 1)
            body = f"{parts[0]} | ... ({hidden - 1} more) | {parts[1]}" if len(parts) == 2 else body
        lines.append(f"{head.ljust(head_width)} | {body} |  {note}")
    return "\n".join(lines)
