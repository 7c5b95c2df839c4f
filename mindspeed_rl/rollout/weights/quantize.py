"""INT8 rollout weights made on the training side (``generate_config.rollout_quantization: int8``).

vLLM has no online INT8 quantization of dense layers, but it serves W8A8 INT8 checkpoints in the
compressed-tensors format (int8 weights with one scale per output channel, activations quantized per token
as they come). The engine starts from a config that declares that format, and every weight sync sends the
freshly trained weights already quantized: the int8 weight and its scales in place of each targeted
projection, everything else (embeddings, norms, the output head, a vision tower, MoE experts) as trained.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, Iterator, Tuple

import torch

# the method name vLLM reports for such an engine (its ``quantization``), and ours for "quantized before sending"
COMPRESSED_TENSORS = "compressed-tensors"

# the projections of the decoder layers (HF names, as the checkpoint names its modules); compressed-tensors reads
# "re:" targets as regular expressions, vLLM matches a fused module (qkv_proj, gate_up_proj) through its parts
INT8_TARGETS = (
    r"re:.*layers\.\d+\.self_attn\.[qkvo]_proj$",
    r"re:.*layers\.\d+\.mlp\.(gate|up|down)_proj$",
)
_TARGET_PATTERNS = tuple(re.compile(target[len("re:") :]) for target in INT8_TARGETS)

INT8_MAX = 127


def int8_quantization_config() -> Dict:
    """The ``quantization_config`` of the engine's config.json: W8A8 INT8, weights symmetric per output channel,
    activations symmetric per token, computed at run time."""
    int8 = {"num_bits": 8, "type": "int", "symmetric": True}
    return {
        "quant_method": COMPRESSED_TENSORS,
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "rollout_int8": {
                "targets": list(INT8_TARGETS),
                "weights": {**int8, "strategy": "channel", "dynamic": False},
                "input_activations": {**int8, "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }


def is_int8_target(module_name: str) -> bool:
    """Whether the module of this HF name is quantized by ``int8_quantization_config``."""
    return any(pattern.match(module_name) for pattern in _TARGET_PATTERNS)


@torch.no_grad()
def quantize_int8_per_channel(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 weights, one scale per output channel (compressed-tensors' own rule)::

        s_n = max_k |W_nk| / 127.5,    Q_nk = clamp(round(W_nk / s_n), -128, 127),    W_nk ~ s_n Q_nk

    Returns ``(Q, s)``: int8 of ``weight``'s shape, float32 of shape ``[N, 1]`` (an all-zero row gets float32's
    epsilon as its scale, and stays zero)."""
    w = weight.float()
    scale = w.abs().amax(dim=1, keepdim=True) / (INT8_MAX + 0.5)
    scale = torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
    quantized = torch.round(w / scale).clamp(-INT8_MAX - 1, INT8_MAX).to(torch.int8)
    return quantized, scale


def int8_named(named: Iterable[Tuple[str, torch.Tensor]]) -> Iterator[Tuple[str, torch.Tensor]]:
    """HF-named weights as the INT8 engine loads them: each targeted projection's ``weight`` becomes its int8
    ``weight`` and ``weight_scale``; every other tensor passes unchanged."""
    for name, tensor in named:
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and tensor.dim() == 2 and is_int8_target(module):
            quantized, scale = quantize_int8_per_channel(tensor)
            yield name, quantized
            yield f"{module}.weight_scale", scale
        else:
            yield name, tensor
