"""The fallback rollout engine: a single-rank megatron-core copy of the actor that samples itself."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from ...config_cls.megatron_config import MegatronConfig
from ...config_cls.model_config import ModelConfig
from .base import Pieces, RolloutEngine, RolloutOutput, RolloutRequest
from .fallback import generate


class FallbackEngine(RolloutEngine):
    name = "fallback"

    def __init__(
        self,
        model: ModelConfig,
        eos_token_id: Optional[int],
        pad_token_id: int = 0,
        bf16: bool = False,
        batch_invariant: bool = False,
        capture_routes: bool = False,
    ):
        from megatron.core import parallel_state as ps

        from ...models import router_replay
        from ...models.builder import build_gpt_model

        if ps.model_parallel_is_initialized():  # its layers take their TP and EP sizes from megatron's groups
            tp, ep = ps.get_tensor_model_parallel_world_size(), ps.get_expert_model_parallel_world_size()
            if tp > 1 or ep > 1:
                raise ValueError(
                    f"the megatron-core rollout engine is one whole copy of the model, but this process's megatron "
                    f"groups are TP {tp} x EP {ep}: build it at actor TP 1 and EP 1, or in a rollout worker"
                )
        self.model_cfg = model
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        # one full copy, no TP/PP: built without parallel_state's stage checks
        self.gpt = build_gpt_model(
            model, MegatronConfig(model="rollout", bf16=bf16), pre_process=True, post_process=True
        )
        self.gpt.eval()
        for p in self.gpt.parameters():
            p.requires_grad_(False)
        self.batch_invariant = batch_invariant
        # route capture: the experts each router used, read after every forward (needs batch-invariant numerics)
        self.route_recorders = router_replay.install([self.gpt], record=True) if capture_routes else None

    def generate(self, request: RolloutRequest) -> List[RolloutOutput]:
        if request.images is not None and any(request.images):
            raise ValueError(
                "the fallback engine generates from text prompts only: prompts with images need vLLM "
                "(generate_config.backend vllm)"
            )
        sampling, n = request.sampling_config(), request.n
        repeated = [list(p) for p in request.prompts for _ in range(n)]
        caps = [int(c) for c in request.max_new_tokens for _ in range(n)] if request.max_new_tokens else None
        outs = generate(
            self.gpt,
            repeated,
            sampling.max_tokens,
            self.eos_token_id,
            self.pad_token_id,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            sampling.min_p,
            seed=request.seed,
            ignore_eos=sampling.ignore_eos,
            min_tokens=sampling.min_tokens,
            caps=caps,
            batch_invariant=self.batch_invariant,
            recorders=self.route_recorders,
        )
        return [
            RolloutOutput(i // n, o.response_ids, o.logprobs, o.finish_reason, routed_experts=o.routes)
            for i, o in enumerate(outs)
        ]

    @torch.no_grad()
    def update_weights(self, weights: Pieces) -> Dict[str, float]:
        params = dict(self.gpt.named_parameters())
        count = {"tensors": 0, "bytes": 0}
        for piece in weights:
            for name, tensor in piece.items():
                if name not in params:
                    raise KeyError(f"rollout model has no parameter {name}")
                params[name].copy_(tensor.to(params[name].dtype))
                count["tensors"] += 1
                count["bytes"] += tensor.numel() * tensor.element_size()
        missing = len(params) - count["tensors"]
        if missing:
            raise ValueError(f"weight update left {missing} rollout parameters untouched")
        return {k: float(v) for k, v in count.items()}
