"""LoRA adapters on megatron-core's tensor-parallel linear layers.

For a linear layer y = x W^T (+ b), the adapted layer is

    y = x W^T (+ b) + (alpha / r) * dropout(x) A^T B^T        A: [r, in], B: [out, r]

with W frozen, A initialised like PEFT (Kaiming-uniform, a = sqrt(5)) and B zero, so training starts
from the base model. Under tensor parallelism the adapters follow the layer's split:

- column-parallel (W split on its output rows: linear_qkv, linear_fc1): A is replicated, B is split like
  W's rows. The input is the same on every rank; the gradient reaching A is summed over the TP ranks
  (each rank's B shard sees only its rows), by megatron's copy-to-TP-region on A's output.
- row-parallel (W split on its input columns: linear_proj, linear_fc2): A is split like W's columns, B is
  replicated. Each rank's x A_local^T is a partial sum, reduced over the TP ranks before B.
- with sequence parallelism the layer's sequence-split side is the adapter's too: column layers gather
  x A^T over the sequence (its backward reduce-scatters), row layers reduce-scatter x A_local^T; the
  replicated factor (A on column, B on row layers) then sees one sequence chunk per rank, so its gradient
  is summed over TP like a norm's.

The experts of MoE layers (linear_fc1 / linear_fc2 of each expert) get adapters too. Their layers leave the
tensor-parallel communication to the token dispatcher (column: no copy of the input; row: partial outputs,
summed by the dispatcher), so their adapters keep the partial sums as well and instead sum the gradient of
their replicated factor over the TP ranks (A on column layers, B on row layers). Expert adapters live with
their expert on its expert-parallel rank and, like the expert's weights, are reduced over the
expert-data-parallel group (``allreduce`` False). The model uses the local layer spec (Transformer Engine
fuses the input norm into linear_qkv / linear_fc1).

The adapters are parameters of the adapted layer itself (``<layer>.lora_A``, ``<layer>.lora_B``), so the base
weights keep their names; ``merged_weight`` gives W + (alpha / r) B A, this rank's shard of the merged model.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import zlib
from typing import Callable, Dict, Optional, Sequence

import torch

from ..checkpoint.tp_split import merge
from ..features.lora import LORA_TARGETS

ADAPTER_NAMES = ("lora_A", "lora_B")
TARGETS = {"linear_qkv": "column", "linear_fc1": "column", "linear_proj": "row", "linear_fc2": "row"}
assert set(TARGETS) == set(LORA_TARGETS)


class LoRAState:
    """Settings shared by every adapted layer of a model; ``enabled`` False gives the base model."""

    def __init__(self, r: int, alpha: float, dropout: float):
        self.r, self.alpha, self.dropout = r, alpha, dropout
        self.enabled = True

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def describe(self) -> dict:
        """What a checkpoint stores about its adapters."""
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout}


def _full_init_a(name: str, r: int, in_features: int, seed: int) -> torch.Tensor:
    """A over the full input width, from a generator seeded by the layer's name: the same at every TP size."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    bound = 1.0 / math.sqrt(in_features)  # kaiming_uniform_(a=sqrt(5)) on a [r, in] matrix
    return (torch.rand(r, in_features, generator=gen) * 2 - 1) * bound


def _mark(param: torch.nn.Parameter, split_dim: Optional[int]) -> None:
    """megatron's TP attributes: split params count once per rank in the grad norm, replicated ones once."""
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    set_tensor_model_parallel_attributes(param, split_dim is not None, split_dim if split_dim is not None else -1, 1)


def adapt_layer(layer: torch.nn.Module, name: str, kind: str, state: LoRAState, seed: int) -> None:
    """Give one column- or row-parallel layer its adapters and route its forward through them."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
        gather_from_tensor_model_parallel_region,
        reduce_from_tensor_model_parallel_region,
        reduce_scatter_to_sequence_parallel_region,
    )

    if "LayerNorm" in type(layer).__name__:
        raise ValueError(
            f"{name}: {type(layer).__name__} fuses the input norm into the linear layer; LoRA needs "
            "the local layer spec"
        )
    tp, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    expert = bool(getattr(layer, "explicit_expert_comm", False))  # the dispatcher does this layer's TP comm
    if expert and ps.get_expert_tensor_parallel_world_size() != tp:
        raise ValueError(f"{name}: LoRA on experts needs the experts' tensor-parallel size equal to TP ({tp})")
    weight = layer.weight
    out_local, in_local = weight.shape
    in_full = in_local * tp if kind == "row" else in_local
    full_a = _full_init_a(name, state.r, in_full, seed)
    a = full_a.chunk(tp, dim=1)[tp_rank] if kind == "row" else full_a
    layer.lora_A = torch.nn.Parameter(a.to(device=weight.device, dtype=weight.dtype).contiguous())
    layer.lora_B = torch.nn.Parameter(torch.zeros(out_local, state.r, device=weight.device, dtype=weight.dtype))
    _mark(layer.lora_A, 1 if kind == "row" else None)
    _mark(layer.lora_B, 0 if kind == "column" else None)
    layer.lora_kind = kind
    for adapter in (layer.lora_A, layer.lora_B):  # expert params: reduced over the expert-data-parallel group
        adapter.allreduce = getattr(weight, "allreduce", True)
    # sequence parallelism: the replicated factor sees one sequence chunk per rank; megatron sums the
    # gradients of parameters marked ``sequence_parallel`` over the TP ranks (as for the norms)
    sequence_parallel = bool(getattr(layer, "sequence_parallel", False)) and not expert and tp > 1
    if sequence_parallel:
        (layer.lora_A if kind == "column" else layer.lora_B).sequence_parallel = True
    # the layer's TP communication, chosen once: on the adapter's factors (expert layers: the replicated
    # factor's gradient summed over TP, partial sums kept like the expert's own output) or on x A^T
    on_a = copy_to_tensor_model_parallel_region if expert and kind == "column" else _identity
    on_b = copy_to_tensor_model_parallel_region if expert and kind == "row" else _identity
    if expert:
        on_h = _identity
    elif kind == "column":  # [s(/tp), b, r] -> the whole sequence on every rank
        on_h = gather_from_sequence_parallel_region if sequence_parallel else copy_to_tensor_model_parallel_region
    else:  # partial sums over TP -> summed (with sequence parallelism: this rank's chunk)
        on_h = (
            reduce_scatter_to_sequence_parallel_region
            if sequence_parallel
            else reduce_from_tensor_model_parallel_region
        )
    gather = (
        gather_from_tensor_model_parallel_region
        if kind == "column" and getattr(layer, "gather_output", False)
        else _identity
    )
    base_forward = layer.forward

    def forward(x, *args, **kwargs):
        output, bias = base_forward(x, *args, **kwargs)
        if not state.enabled:
            return output, bias
        dropped = torch.nn.functional.dropout(x, state.dropout, training=layer.training) if state.dropout else x
        h = on_h(torch.nn.functional.linear(dropped, on_a(layer.lora_A)))
        update = gather(torch.nn.functional.linear(h, on_b(layer.lora_B)) * state.scaling)
        return output + update.to(output.dtype), bias

    layer.forward = forward


def _local_expert_offset(model: torch.nn.Module) -> int:
    """The global number of this expert-parallel rank's first expert (0 without experts)."""
    from megatron.core import parallel_state as ps

    total = getattr(getattr(model, "config", None), "num_moe_experts", None)
    if not total:
        return 0
    ep = ps.get_expert_model_parallel_world_size()
    return ps.get_expert_model_parallel_rank() * (total // ep)


def _contiguous_output_grad(module, args, output):
    """The logits' gradient arrives transposed (GPTModel returns [b, s, V] of an [s, b, V] output); megatron's
    frozen-weight linear multiplies it as it comes, which torch turns into a batched matmul over a copy of the
    weight per position (20x slower in bf16 on CPU). A contiguous gradient keeps it one matmul."""
    logits = output[0] if isinstance(output, tuple) else output
    if logits.requires_grad:
        logits.register_hook(lambda grad: grad.contiguous())


def apply_lora(
    model: torch.nn.Module,
    r: int,
    alpha: float,
    dropout: float = 0.0,
    targets: Sequence[str] = tuple(TARGETS),
    seed: int = 1,
) -> LoRAState:
    """Adapters on every ``targets`` layer of ``model``; every other parameter is frozen. Returns the
    shared state (``enabled`` switches the adapters off for the reference model)."""
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"LoRA targets {unknown} are not among {sorted(TARGETS)}")
    state = LoRAState(r, alpha, dropout)
    for p in model.parameters():
        p.requires_grad_(False)
    # seed A by the global layer and expert number: the same at every PP split and EP size
    layers = getattr(getattr(model, "decoder", None), "layers", None)
    offset = getattr(layers[0], "layer_number", 1) - 1 if layers is not None and len(layers) else 0
    experts = _local_expert_offset(model)
    adapted = 0
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in targets and hasattr(module, "weight"):
            global_name = re.sub(r"layers\.(\d+)\.", lambda m: f"layers.{int(m.group(1)) + offset}.", name, count=1)
            global_name = re.sub(
                r"local_experts\.(\d+)\.", lambda m: f"local_experts.{int(m.group(1)) + experts}.", global_name, count=1
            )
            adapt_layer(module, global_name, TARGETS[leaf], state, seed)
            adapted += 1
    if not adapted:
        raise ValueError(f"no layer named {list(targets)} in the model: nothing to adapt")
    if getattr(model, "output_layer", None) is not None:
        model.output_layer.register_forward_hook(_contiguous_output_grad)
    return state


def adapter_parameters(model: torch.nn.Module) -> Dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in ADAPTER_NAMES}


def merged_weight(layer: torch.nn.Module, state: LoRAState) -> torch.Tensor:
    """This rank's shard of W + (alpha / r) B A."""
    return merge(layer.weight, layer.lora_A, layer.lora_B, state.scaling)


def merged_weight_sources(model: torch.nn.Module, state: LoRAState) -> Dict[str, Callable[[], torch.Tensor]]:
    """name -> a function giving that weight with its adapter merged in (the merge runs when it is called),
    without the adapters themselves: the names and shapes of the base model, for resharding, HF export and
    the rollout."""
    layers = {name: module for name, module in model.named_modules() if hasattr(module, "lora_A")}
    sources: Dict[str, Callable[[], torch.Tensor]] = {}
    for name, tensor in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if leaf in ADAPTER_NAMES or name.endswith("_extra_state"):
            continue
        if leaf == "weight" and owner in layers:
            sources[name] = functools.partial(merged_weight, layers[owner], state)
        else:
            sources[name] = functools.partial(torch.Tensor.detach, tensor)
    return sources


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def adapters_disabled(state: LoRAState):
    """The base model (the reference policy) while the block runs."""
    previous, state.enabled = state.enabled, False
    try:
        yield
    finally:
        state.enabled = previous
