"""Full megatron-named pieces -> HF-named tensors (what vLLM's model loaders take), by the model's family."""

from __future__ import annotations

import re
from typing import Dict, Iterable, Iterator, Tuple

import torch

from ...checkpoint.tp_split import layer_number
from ...config_cls.model_config import ModelConfig
from ...families import get_family
from ...families.base import EMBED, FINAL_NORM, OUTPUT_MG

HF_EXPERT = re.compile(r"\.experts\.(\d+)\.")  # one routed expert's tensor in HF names (not a fused experts tensor)


def hf_expert_number(name: str) -> int:
    """The routed expert an HF-named tensor belongs to (-1: none, or all experts in one fused tensor)."""
    m = HF_EXPERT.search(name)
    return int(m.group(1)) if m else -1


def hf_named(pieces: Iterable[Dict[str, torch.Tensor]], cfg: ModelConfig) -> Iterator[Tuple[str, torch.Tensor]]:
    family = get_family(cfg.model_type_hf)
    named = family.saved_hf_name
    for piece in pieces:
        if EMBED[1] in piece:
            yield named(EMBED[0]), piece[EMBED[1]]
        for name, tensor in piece.items():
            extra = family.extra_mcore_to_hf(name)  # a vision tower: synchronised with the language model
            if extra is not None:
                yield extra, tensor
        for i in sorted({layer_number(n) for n in piece if layer_number(n) >= 0}):
            yield from ((named(name), t) for name, t in family.layer_mcore_to_hf(i, piece, cfg).items())
        if FINAL_NORM[1] in piece:
            yield named(FINAL_NORM[0]), piece[FINAL_NORM[1]]
            if OUTPUT_MG in piece and cfg.untie_embeddings_and_output_weights:
                yield "lm_head.weight", piece[OUTPUT_MG]
