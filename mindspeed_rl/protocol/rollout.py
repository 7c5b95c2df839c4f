"""What crosses Ray around generation: one sampled response, and one rank's answer to a generate call."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class RolloutOutput:
    """One sampled response: its token ids, per-token log-probs and why it stopped."""

    prompt_index: int
    response_ids: List[int]
    logprobs: List[float]
    finish_reason: str  # "stop" or "length"


@dataclass
class RolloutResult:
    """One actor rank's answer to ``generate``.

    Every rank of an engine receives the same requests; only the engine's first rank returns the
    outputs (``None`` elsewhere). ``request_digest`` fingerprints the requests the rank received,
    so the driver can check that all ranks of one engine generated the same thing.
    """

    rank: int
    engine: int
    request_digest: str
    outputs: Optional[List[RolloutOutput]]
    timing: Dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RankLayout:
    """Where one rank of a worker group sits: its train (TP, PP, DP) coordinates, whether it returns
    its DP group's outputs, and (actor ranks) which rollout engine it belongs to."""

    rank: int
    dp_rank: int
    dp_size: int
    tp_rank: int
    pp_rank: int
    output: bool                 # first TP rank of the last PP stage: holds the DP group's outputs
    engine: int = -1             # rollout engine index (-1: no engine)
    engine_rank: int = -1        # rank inside that engine (0 returns the outputs)
    engine_size: int = 0         # ranks per engine (infer TP)
