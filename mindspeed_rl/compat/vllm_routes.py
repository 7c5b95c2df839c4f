"""The experts vLLM routes every token to, per MoE layer, for router replay (R3).

vLLM 0.32 returns routed experts (``enable_return_routed_experts``) only through its model runner V2, which needs
Triton kernels: not on CPU, and not in the 0.18 / 0.23 releases the Ascend stack pins. What every release here
has is the router's top-k inside each MoE layer's forward; vLLM 0.32's routers take a capture callback
(``BaseRouter.set_capture_fn``, the hook its own capturer binds). This module binds one per MoE layer inside the
worker and files each forward's top-k ids under (request, position), read from the model runner's batch layout
at that moment (``input_batch.req_ids``, ``query_start_loc``, ``positions``).

Positions a forward does not compute have no route: a prefix-cache hit (the engine turns prefix caching off when
it captures) and the last sampled token (never fed back).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

import numpy as np
import torch

NO_ROUTE = -1  # a position the engine did not forward
ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
LAYER_IN_NAME = re.compile(r"layers\.(\d+)\.")


CAPTURING_RELEASE = (0, 32)  # the first release whose every MoE path (CPU's included) routes through BaseRouter


def capture_unavailable() -> Optional[str]:
    """Why this vLLM cannot capture routes (None when it can). Before 0.32 the CPU MoE kernel routes inside
    itself, past the router's capture hook (0.23 measured: no forward reached it)."""
    import vllm

    version = vllm.__version__
    release = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if release < CAPTURING_RELEASE:
        return f"vLLM {version} cannot return routed experts (0.32 or later can)"
    try:
        from vllm.model_executor.layers.fused_moe.layer import MoERunner  # noqa: F401
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    except ImportError as exc:
        return f"this vLLM has no MoE router capture hook ({exc})"
    if not hasattr(BaseRouter, "set_capture_fn"):
        return "this vLLM's MoE router has no capture hook (BaseRouter.set_capture_fn)"
    return None


class _Recorder:
    """Per forward step: the token layout once, then each MoE layer's top-k ids (as int16, on host)."""

    def __init__(self, runner: Any, layers: List[int]) -> None:
        self.runner, self.layers = runner, layers
        self.index = {layer: i for i, layer in enumerate(layers)}
        self.steps: List[Dict[str, Any]] = []

    def capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        runner = self.runner
        requests = runner.input_batch.num_reqs
        if requests == 0:  # warm-up and profiling forwards
            return
        if layer == self.layers[0] or not self.steps:
            starts = runner.query_start_loc.cpu[: requests + 1].clone()
            tokens = int(starts[-1])
            self.steps.append(
                {
                    "requests": list(runner.input_batch.req_ids[:requests]),
                    "counts": (starts[1:] - starts[:-1]).numpy(),
                    "positions": runner.positions[:tokens].detach().to("cpu", copy=True).numpy(),
                    "ids": [None] * len(self.layers),
                }
            )
        step = self.steps[-1]
        step["ids"][self.index[layer]] = topk_ids[: len(step["positions"])].detach().to("cpu", torch.int16).numpy()

    def take(self) -> Dict[str, np.ndarray]:
        """{engine request id: int16 [positions, layers, top-k]} of the steps so far (then forgotten); positions
        never forwarded hold NO_ROUTE."""
        pieces: Dict[str, List] = {}
        for step in self.steps:
            if any(ids is None for ids in step["ids"]):
                continue  # a forward that did not reach every MoE layer
            stacked = np.stack(step["ids"], axis=1)  # [tokens, layers, k]
            start = 0
            for request, count in zip(step["requests"], step["counts"]):
                pieces.setdefault(request, []).append(
                    (step["positions"][start : start + count], stacked[start : start + count])
                )
                start += count
        self.steps = []
        routes = {}
        for request, parts in pieces.items():
            length = max(int(pos.max()) for pos, _ in parts) + 1
            table = np.full((length, len(self.layers), parts[0][1].shape[-1]), NO_ROUTE, dtype=np.int16)
            for pos, ids in parts:
                table[pos] = ids
            routes[request] = table
        return routes


def _install(worker: Any) -> int:
    """Runs inside a vLLM worker: a capture callback on every MoE layer's router; the number of MoE layers."""
    from vllm.model_executor.layers.fused_moe.layer import MoERunner
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    runner = worker.model_runner
    moe = {}  # transformer layer index (0.32's layer_id; 0.23's from the module's name) -> its MoE runner
    for name, module in runner.get_model().named_modules():
        if isinstance(module, MoERunner) and isinstance(module.router, BaseRouter):
            layer = getattr(module, "layer_id", None)
            moe[int(layer if layer is not None else LAYER_IN_NAME.search(name).group(1))] = module
    recorder = _Recorder(runner, sorted(moe))
    for layer, module in moe.items():
        module.router.set_capture_fn(lambda ids, layer=layer: recorder.capture(layer, ids))
    runner._mindspeed_rl_routes = recorder
    return len(moe)


def _take(worker: Any) -> Dict[str, np.ndarray]:
    return worker.model_runner._mindspeed_rl_routes.take()


def install_route_capture(llm: Any) -> int:
    """Capture routes in every worker of ``llm``; the number of MoE layers (0: not an MoE model)."""
    return int(llm.collective_rpc(_install)[0])


def take_routes(llm: Any) -> Dict[str, torch.Tensor]:
    """The routes captured since the last call, int16 tensors (this process's worker: every TP rank routes the
    same tokens alike), by the request ids ``llm.generate`` gives its outputs (vLLM 0.32 suffixes the engine's
    own ids with "-<8 hex digits>")."""
    captured = llm.collective_rpc(_take)[0]
    return {ENGINE_SUFFIX.sub("", request): torch.from_numpy(table) for request, table in captured.items()}
