"""Full megatron-named pieces -> HF-named tensors (what vLLM's model loaders take)."""
from __future__ import annotations

from typing import Dict, Iterable, Iterator, Tuple

import torch

from ..checkpoint import hf_mapping as hm
from ..checkpoint.tp_split import layer_number
from ..config_cls.model_config import ModelConfig


def hf_named(pieces: Iterable[Dict[str, torch.Tensor]], cfg: ModelConfig) -> Iterator[Tuple[str, torch.Tensor]]:
    for piece in pieces:
        if hm.EMBED[1] in piece:
            yield hm.EMBED[0], piece[hm.EMBED[1]]
        for i in sorted({layer_number(n) for n in piece if layer_number(n) >= 0}):
            yield from hm.layer_mcore_to_hf(i, piece, cfg).items()
        if hm.FINAL_NORM[1] in piece:
            yield hm.FINAL_NORM[0], piece[hm.FINAL_NORM[1]]
            if hm.OUTPUT_MG in piece and cfg.untie_embeddings_and_output_weights:
                yield "lm_head.weight", piece[hm.OUTPUT_MG]
