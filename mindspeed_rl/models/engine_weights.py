"""The weights of an engine's rank under the names checkpoints use: one GPTModel, or with an interleaved pipeline
(VPP) its model chunks, whose layers are numbered across the chunks in chunk order (the pipeline rank's own layer
numbers; ``megatron.stage_layers`` maps them to the global ones)."""

from __future__ import annotations

from functools import partial
from typing import Callable, Dict, Iterable, List, Tuple

import torch

from ..checkpoint.tp_split import shift_layer


class EngineWeights:
    """Mixed into MegatronEngine: ``model`` (the chunks, DDP-wrapped when trainable), ``chunk_offsets`` (layers
    before each chunk on this rank), ``lora``, ``optimizer`` and ``role`` come from it."""

    model: List[torch.nn.Module]
    chunk_offsets: List[int]

    def chunks(self) -> List:
        """This rank's GPTModels (without the DDP wrapper): one, or its model chunks with VPP."""
        return [getattr(chunk, "module", chunk) for chunk in self.model]

    def unwrapped(self):
        """The GPTModel of this rank that holds the head (with VPP: its last model chunk)."""
        return self.chunks()[-1]

    def _rank_names(self, named: Callable[[torch.nn.Module], Iterable[Tuple[str, torch.Tensor]]]):
        """(name, tensor) over the chunks, each chunk's layers renumbered after the chunks before it."""
        for chunk, offset in zip(self.chunks(), self.chunk_offsets):
            for name, tensor in named(chunk):
                yield (shift_layer(name, offset) if offset else name), tensor

    def named_parameters(self) -> Iterable[Tuple[str, torch.nn.Parameter]]:
        """This rank's parameters under the names checkpoints use (layers numbered across its chunks)."""
        return self._rank_names(lambda chunk: chunk.named_parameters())

    def parameters(self) -> Iterable[torch.nn.Parameter]:
        return (p for _, p in self.named_parameters())

    def named_weights(self) -> Iterable[Tuple[str, torch.Tensor]]:
        """Everything the model holds (with LoRA: the base weights and the adapters), as checkpoints store it."""
        for name, tensor in self._rank_names(lambda chunk: chunk.state_dict().items()):
            if isinstance(tensor, torch.Tensor) and not name.endswith("_extra_state"):
                yield name, tensor

    def trainable_names(self) -> List[str]:
        """The parameters the optimizer updates (with LoRA: the adapters, and a critic's value head)."""
        return [n for n, p in self.named_parameters() if p.requires_grad]

    def export_weight_sources(self) -> Dict[str, Callable[[], torch.Tensor]]:
        """name -> a function giving that weight as a plain model of this shape has it (with LoRA: the adapter
        merged in when called): what the rollout engines, the reference and HF export take, on demand."""
        if self.lora is None:
            return {n: partial(torch.Tensor.detach, t) for n, t in self.named_weights()}
        from .lora import merged_weight_sources

        return merged_weight_sources(self.unwrapped(), self.lora)

    def export_weights(self) -> Iterable[Tuple[str, torch.Tensor]]:
        """(name, weight) of ``export_weight_sources``, one weight at a time."""
        for name, make in self.export_weight_sources().items():
            yield name, make()

    @torch.no_grad()
    def load_weights(self, weights: Dict[str, torch.Tensor]) -> None:
        """Copy this rank's shards into the model (and the optimizer's fp32 main copy). Weights without LoRA
        adapters (a base model) leave the adapters as initialised."""
        from .lora import ADAPTER_NAMES

        own = dict(self.named_parameters())
        has_adapters = any(n.rsplit(".", 1)[-1] in ADAPTER_NAMES for n in weights)
        if has_adapters and self.lora is None:
            raise ValueError(
                f"the weights for {self.role.name} carry LoRA adapters but {self.role.name}_config.lora_r is 0: "
                "train with the same lora_r, or export merged weights (cli/convert_ckpt.py --save-model-type hf)"
            )
        if not has_adapters:
            own = {n: p for n, p in own.items() if n.rsplit(".", 1)[-1] not in ADAPTER_NAMES}
        missing = [n for n in own if n not in weights]
        if missing:
            raise KeyError(f"weights for {self.role.name} lack {missing[:3]}{'...' if len(missing) > 3 else ''}")
        # persistent buffers (the MoE router's expert bias) load too when the weights carry them
        own.update((n, t) for n, t in self.named_weights() if n not in own and n in weights)
        for name, param in own.items():
            src = weights[name]
            if tuple(src.shape) != tuple(param.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)} != model shape {tuple(param.shape)}")
            param.copy_(src.to(param.dtype))
        if self.optimizer is not None:
            self.optimizer.reload_model_params()
