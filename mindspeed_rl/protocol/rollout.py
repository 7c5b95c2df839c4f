"""What crosses Ray: generation requests and answers, and the typed answers of the workers' other calls."""

from __future__ import annotations

import dataclasses
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
    # router replay: the experts the engine routed each token of prompt + response to, an int16 tensor
    # [positions, MoE layers, top-k] (compat/vllm_routes.py; the last token, never forwarded, holds none)
    routed_experts: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class RolloutRequest:
    """n responses for each prompt; response j (prompt j // n) is seeded ``seed + j``.

    The one shape of a request from the rollout layers to the engine: the worker group sends each engine its
    :meth:`part` as it is, the worker fills in the default sampling (:meth:`with_sampling`) and its engine
    generates it."""

    prompts: List[List[int]]
    n: int
    seed: int
    sampling: Optional[SamplingConfig] = None  # None: generate_config.sampling_config
    max_new_tokens: Optional[List[int]] = None  # per-prompt response budgets (below sampling.max_tokens)
    # per-prompt images as the dataset stores them (datasets/images.py: length-prefixed PNGs; b"" for none), the
    # prompt holding one <|image_pad|> per image token (rollout/engines/multimodal.py turns them into vLLM's inputs)
    images: Optional[List[bytes]] = None

    @classmethod
    def of(
        cls,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        n: int = 1,
        seed: Optional[int] = None,
        max_new_tokens: Optional[Sequence[int]] = None,
    ) -> "RolloutRequest":
        """A request with its own sampling, seeded ``sampling.seed`` unless ``seed`` is given."""
        return cls(
            [list(p) for p in prompts],
            n,
            sampling.seed if seed is None else seed,
            sampling,
            None if max_new_tokens is None else [int(t) for t in max_new_tokens],
        )

    def part(self, rows: Sequence[int]) -> "RolloutRequest":
        """The prompts ``rows`` (contiguous, ascending) with their budgets; seeds continue where they stand in
        the whole request, so a sample's seed does not depend on how the prompts were split."""
        rows = [int(i) for i in rows]
        return RolloutRequest(
            [list(self.prompts[i]) for i in rows],
            self.n,
            self.seed + self.n * (rows[0] if rows else 0),
            self.sampling,
            None if self.max_new_tokens is None else [int(self.max_new_tokens[i]) for i in rows],
            None if self.images is None else [self.images[i] for i in rows],
        )

    def sampling_config(self) -> SamplingConfig:
        """The sampling an engine generates with: the request's own (the worker has filled in the default)."""
        if self.sampling is None:
            raise ValueError("the rollout request names no sampling: the worker fills in generate_config's")
        return self.sampling

    def with_sampling(self, default: SamplingConfig) -> "RolloutRequest":
        """This request with ``default`` where it names no sampling of its own."""
        return self if self.sampling is not None else dataclasses.replace(self, sampling=default)

    def digest(self, version: Optional[int] = None) -> str:
        """Fingerprint of the request one rank received for policy ``version`` (``RolloutResult.request_digest``):
        every rank of an engine must receive the same."""
        images = None if self.images is None else [hashlib.sha1(blob).hexdigest() for blob in self.images]
        fields: tuple = (list(map(list, self.prompts)), self.n, self.seed, self.sampling, self.max_new_tokens, version)
        if images is not None:
            fields += (images,)
        return hashlib.sha1(repr(fields).encode()).hexdigest()


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
    None on ranks that do not hold their DP group's output), the seconds of named phases, and metrics of the
    whole forward (router replay's mismatch)."""

    per_row: Optional[torch.Tensor]
    timing: Dict[str, float] = field(default_factory=dict)
    metrics: Dict[str, float] = field(default_factory=dict)  # the same on every rank (reduced over the group)


@dataclass
class LoadedState:
    """What a worker's checkpoint load found: the iteration it was saved at (0: fresh weights) and the
    trainer state saved with it."""

    iteration: int = 0
    trainer_state: Dict = field(default_factory=dict)


@dataclass(frozen=True)
class WorldSpec:
    """A rank's place in its group's own torch.distributed world (the group's master address and port) and the
    CPU threads it may use: what every worker is started with."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    threads: int


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

    @staticmethod
    def of_engine_rank(rank: int, world_size: int, engine_size: int) -> "RankLayout":
        """A rank of an inference-only group (rollout workers, the judge's engines): engines are blocks of
        ``engine_size`` contiguous ranks, each engine a data-parallel replica whose first rank returns outputs."""
        engine, engine_rank = divmod(rank, engine_size)
        return RankLayout(
            rank=rank,
            dp_rank=engine,
            dp_size=world_size // engine_size,
            tp_rank=engine_rank,
            pp_rank=0,
            output=engine_rank == 0,
            engine=engine,
            engine_rank=engine_rank,
            engine_size=engine_size,
        )
