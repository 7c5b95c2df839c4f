"""What crosses Ray: generation requests and answers, and the typed answers of the workers' other calls."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..config_cls.generate_config import SamplingConfig


@dataclass
class RolloutOutput:
    """One sampled response: its token ids, per-token log-probs and why it stopped."""

    prompt_index: int
    response_ids: List[int]
    logprobs: List[float]
    finish_reason: str  # "stop" or "length"
    versions: Optional[List[int]] = None  # policy version of each token (partial rollout); None: one version
    loss_mask: Optional[List[int]] = None  # 0 on tokens the policy did not generate (tool results); None: all 1


@dataclass(frozen=True)
class RolloutRequest:
    """n responses for each prompt; response j (prompt j // n) is seeded ``seed + j``."""

    prompts: List[List[int]]
    n: int
    seed: int
    sampling: Optional[SamplingConfig] = None  # None: generate_config.sampling_config
    max_new_tokens: Optional[List[int]] = None  # per-prompt response budgets (below sampling.max_tokens)


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
    started: Optional[float] = None  # wall clock (time.time()) when generation began on this rank


def request_digest(
    prompts: Sequence[Sequence[int]],
    n: int,
    seed: int,
    sampling: Optional[SamplingConfig],
    max_new_tokens: Optional[Sequence[int]],
    version: Optional[int],
) -> str:
    """Fingerprint of the requests one rank received (``RolloutResult.request_digest``)."""
    return hashlib.sha1(
        repr((list(map(list, prompts)), n, seed, sampling, max_new_tokens, version)).encode()
    ).hexdigest()


def by_prompt(outputs: Iterable[RolloutOutput]) -> Dict[int, List[RolloutOutput]]:
    """Outputs grouped by their prompt index, each group in the order given."""
    grouped: Dict[int, List[RolloutOutput]] = {}
    for out in outputs:
        grouped.setdefault(out.prompt_index, []).append(out)
    return grouped


def slowest(timings: Iterable[Dict[str, float]]) -> Dict[str, float]:
    """Each named phase's longest time over the ranks that report it (the ranks run in parallel)."""
    out: Dict[str, float] = {}
    for timing in timings:
        for key, value in timing.items():
            out[key] = max(out.get(key, 0.0), value)
    return out


@dataclass
class GeneratedBatch:
    """Outputs of every engine with global prompt indices, the slowest rank's timings, every rank's result."""

    outputs: List[RolloutOutput]
    timing: Dict[str, float]
    per_rank: List[RolloutResult]

    @property
    def window(self) -> Optional[Tuple[float, float]]:
        """Wall-clock start and end of the generation over the ranks (None when not recorded)."""
        spans = [
            (r.started, r.started + r.timing.get("timing/generate", 0.0))
            for r in self.per_rank
            if r.started is not None
        ]
        return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None


@dataclass
class ForwardAnswer:
    """One rank's answer to a forward over experience rows: a tensor with one entry per row ([B] or [B, R];
    None on ranks that do not hold their DP group's output) and the seconds of named phases."""

    per_row: Optional[torch.Tensor]
    timing: Dict[str, float] = field(default_factory=dict)


@dataclass
class LoadedState:
    """What a worker's checkpoint load found: the iteration it was saved at (0: fresh weights) and the
    trainer state saved with it."""

    iteration: int = 0
    trainer_state: Dict = field(default_factory=dict)


@dataclass(frozen=True)
class RankLayout:
    """Where one rank of a worker group sits: its train (TP, PP, DP) coordinates, whether it returns
    its DP group's outputs, and (actor ranks) which rollout engine it belongs to."""

    rank: int
    dp_rank: int
    dp_size: int
    tp_rank: int
    pp_rank: int
    output: bool  # first TP rank of the last PP stage: holds the DP group's outputs
    engine: int = -1  # rollout engine index (-1: no engine)
    engine_rank: int = -1  # rank inside that engine (0 returns the outputs)
    engine_size: int = 0  # ranks per engine (infer TP)
