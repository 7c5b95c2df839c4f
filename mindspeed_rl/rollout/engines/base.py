"""The rollout engine interface shared by vLLM and the megatron-core fallback."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, Iterable, List

import torch

from ...protocol.rollout import RolloutOutput, RolloutRequest

Pieces = Iterable[Dict[str, torch.Tensor]]  # full megatron-named tensors, one model piece per item


class RolloutEngine(ABC):
    """Generates responses; receives new weights from the actor; frees its memory between rollouts."""

    name = "base"
    tensor_parallel_size = 1  # ranks that form one engine (contiguous ranks of the actor's world)
    generates_in_step = False  # shares its MoE layers with other engines: generates at every call, prompts or not

    @abstractmethod
    def generate(self, request: RolloutRequest) -> List[RolloutOutput]:
        """The request's n responses per prompt, grouped by prompt (prompt 0's n responses first), sample i
        seeded ``request.seed + i``; ``max_new_tokens`` caps each prompt's responses below
        ``sampling.max_tokens`` (per-prompt budgets). The request names its sampling (the worker fills in
        generate_config's)."""

    @abstractmethod
    def update_weights(self, weights: Pieces) -> Dict[str, float]:
        """Load the actor's full weights, streamed piece by piece (see resharding.iter_full_weights)."""

    def offload(self) -> None:
        """Free what generation holds (KV cache, or sleep) while training runs."""

    def onload(self) -> None:
        """Undo offload before the next generation."""

    def shutdown(self) -> None:
        """Release the engine (before the process group it may share is destroyed); the process goes on."""

    def release_at_exit(self) -> None:
        """The process ends next (a worker at the end of its run): free only what would outlive it."""
        self.shutdown()
