"""Checkpoints that store each MoE layer's experts as two fused tensors (Qwen3-VL-MoE, Qwen3.5-MoE on the Hub):

    mlp.experts.gate_up_proj   [E, 2F, H] (module layout) or [E, H, 2F] (transposed), gate rows / columns first
    mlp.experts.down_proj      [E, H, F]                  or [E, F, H]

The maps work per expert (``mlp.experts.{e}.gate_proj`` ...): a fused folder is split on reading (the orientation told
apart by shape, the family's own when H = 2F) and fused again on writing, in the family's Hub orientation; a folder
with per-expert tensors (transformers 5.19 writes them, as some fine-tuned checkpoints do) is read as it is. vLLM gets
one tensor per expert (its loaders take both)."""

from __future__ import annotations

from typing import Dict, List

import torch

from ..config_cls.model_config import ModelConfig
from .base import HF_LAYER, ModelFamily

Tensors = Dict[str, torch.Tensor]
_FUSED = ("gate_up_proj", "down_proj")


class FusedExperts(ModelFamily):
    """Mixed in before a MoE family: reads fused or per-expert folders, writes fused ones."""

    #: the Hub stores the fused tensors transposed ([E, H, 2F], [E, F, H]: Qwen3-VL-MoE) or in the module's layout
    hub_experts_transposed = False

    def read_hf_layer(self, i: int, cfg: ModelConfig, reader) -> Tensors:
        prefix = HF_LAYER.format(i=i) + "mlp.experts."
        if prefix + _FUSED[0] not in reader:
            return super().read_hf_layer(i, cfg, reader)
        per_expert = set(self.expert_names(i, cfg))
        out = {n: reader.get(n) for n in self.hf_layer_names(i, cfg) if n not in per_expert}
        gate_up, down = (reader.get(prefix + kind) for kind in _FUSED)
        h, f = cfg.hidden_size, cfg.moe_ffn_hidden_size
        if tuple(gate_up.shape[1:]) == (h, 2 * f) and (h != 2 * f or self.hub_experts_transposed):
            gate_up = gate_up.transpose(1, 2)
        if tuple(down.shape[1:]) == (f, h) and (h != f or self.hub_experts_transposed):
            down = down.transpose(1, 2)
        for e in range(cfg.num_experts):
            gate, up = gate_up[e].chunk(2, dim=0)
            out.update({f"{prefix}{e}.gate_proj.weight": gate, f"{prefix}{e}.up_proj.weight": up})
            out[f"{prefix}{e}.down_proj.weight"] = down[e]
        return out

    def hf_tensors_to_save(self, tensors: Tensors, cfg: ModelConfig) -> Tensors:
        """A layer's HF tensors (one per expert) with its experts fused as the Hub's checkpoints store them."""
        out = {n: t for n, t in tensors.items() if ".mlp.experts." not in n}
        layers = sorted({int(n.split(".")[2]) for n in tensors if ".mlp.experts." in n})
        turn = (lambda t: t.t()) if self.hub_experts_transposed else (lambda t: t)  # noqa: E731
        for i in layers:
            prefix = HF_LAYER.format(i=i) + "mlp.experts."
            take = lambda e, kind: tensors[f"{prefix}{e}.{kind}_proj.weight"]  # noqa: E731
            experts = range(cfg.num_experts)
            gate_up = [turn(torch.cat([take(e, "gate"), take(e, "up")])) for e in experts]
            out[prefix + "gate_up_proj"] = torch.stack(gate_up).contiguous()
            out[prefix + "down_proj"] = torch.stack([turn(take(e, "down")) for e in experts]).contiguous()
        return out

    def expert_names(self, i: int, cfg: ModelConfig) -> List[str]:
        prefix = HF_LAYER.format(i=i) + "mlp.experts."
        kinds = ("gate_proj", "up_proj", "down_proj")
        return [f"{prefix}{e}.{kind}.weight" for e in range(cfg.num_experts) for kind in kinds]
