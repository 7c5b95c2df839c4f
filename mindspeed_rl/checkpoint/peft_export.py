"""A LoRA run's adapters as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors).

Megatron fuses q, k, v into linear_qkv and gate, up into linear_fc1; one adapter there is one A shared by
the parts and one B stacked like the weight's rows. PEFT adapts the HF projections separately, so each
part gets the shared A and its rows of B: q_proj's update B_q A is exactly the q rows of B A, and so on.
Names follow PEFT's layout, ``base_model.model.<HF weight name without .weight>.lora_A.weight``.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Dict, Optional

import torch
from safetensors.torch import save_file

from ..config_cls.model_config import ModelConfig
from ..families import get_family
from . import megatron_layout as ml
from .errors import ConversionError
from .megatron_reader import iter_mg_pieces, read_mg_config
from .tp_split import layer_number

HF_TARGETS = {
    "linear_qkv": ["q_proj", "k_proj", "v_proj"],
    "linear_proj": ["o_proj"],
    "linear_fc1": ["gate_proj", "up_proj"],
    "linear_fc2": ["down_proj"],
}


def _peft_name(hf_weight: str, adapter: str) -> str:
    return f"base_model.model.{hf_weight[: -len('.weight')]}.{adapter}.weight"


def layer_adapters(i: int, piece: Dict[str, torch.Tensor], cfg: ModelConfig) -> Dict[str, torch.Tensor]:
    """PEFT tensors of layer ``i`` from its merged megatron tensors (global names, adapters not folded)."""
    from ..families.base import qkv_from_mcore

    names = get_family(cfg.model_type_hf).layer_names(i, cfg)
    out: Dict[str, torch.Tensor] = {}

    def add(hf_weights, mg_weight, split_b):
        layer = mg_weight[: -len(".weight")]
        if layer + ".lora_A" not in piece:
            return
        a, b = piece[layer + ".lora_A"], piece[layer + ".lora_B"]
        for hf_weight, b_part in zip(hf_weights, split_b(b)):
            out[_peft_name(hf_weight, "lora_A")] = a.clone()  # each projection its own copy (safetensors)
            out[_peft_name(hf_weight, "lora_B")] = b_part.clone()

    for triple, mg in names.qkv:
        if mg.endswith(".weight"):
            add(triple, mg, lambda b: qkv_from_mcore(b, cfg))
    for pair, mg in names.fc1:
        add(pair, mg, lambda b: b.chunk(2, dim=0))
    for hf, mg in names.renamed:
        if mg.endswith(("linear_proj.weight", "linear_fc2.weight")):
            add([hf], mg, lambda b: [b])
    return out


def has_expert_adapters(load_dir: str) -> bool:
    """Whether the latest checkpoint's MoE experts carry adapters (read from its first rank file's names)."""
    _, iter_dir, _, pp = read_mg_config(load_dir)
    ep = ml.full_layout_of(iter_dir)[2]
    names = ml.safe_load(ml.rank_file(iter_dir, 0, 0, pp, 0, ep), mmap=True)["model"]
    return any(".local_experts." in n and n.endswith(".lora_A") for n in names)


def write_peft_adapter(load_dir: str, out_dir: str, base_model: Optional[str] = None) -> str:
    """The adapters of ``load_dir``'s latest checkpoint as a PEFT folder ``out_dir`` (staged, then renamed).
    Adapters on MoE experts are refused: transformers holds the experts as fused 3-D parameters, which PEFT
    adapts in another form than per-expert projections."""
    config, _, _, _ = read_mg_config(load_dir)
    lora = config.get("lora")
    if not lora:
        raise ConversionError(f"{load_dir}: the checkpoint has no LoRA adapters (trained without lora_r)")
    if has_expert_adapters(load_dir):
        raise ConversionError(
            f"{load_dir}: its MoE experts carry LoRA adapters, which have no PEFT form for transformers' fused "
            "experts; use the merged model (--save-model-type hf)"
        )
    cfg = ModelConfig(**config["model"])
    tensors: Dict[str, torch.Tensor] = {}
    targets = set()
    for piece in iter_mg_pieces(load_dir, fold=False):
        for i in sorted({layer_number(n) for n in piece if layer_number(n) >= 0}):
            found = layer_adapters(i, piece, cfg)
            tensors.update(found)
            targets.update(n.split(".")[-3] for n in found)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": int(lora["r"]),
        "lora_alpha": float(lora["alpha"]),
        "lora_dropout": float(lora.get("dropout", 0.0)),
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "base_model_name_or_path": base_model,
    }
    staging = out_dir + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    save_file(tensors, os.path.join(staging, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(staging, "adapter_config.json"), "w", encoding="utf-8") as fh:
        json.dump(adapter_config, fh, indent=2)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(staging, out_dir)
    return out_dir
