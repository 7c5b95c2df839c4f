"""Router replay (R3): an MoE model's training forward routes each token to the experts the rollout engine routed
it to, and counts how often its own router would have chosen otherwise.

megatron-core's router hands its top-k choice to ``router.router_replay`` when one is set (``topk_routing_with_
score_function(..., router_replay=...)``); :class:`LayerReplay` stands in there for one MoE layer, without the
library's global list of instances (a reference or teacher model built beside the actor keeps its own routers).

Routes travel with a sample as int16 [positions, MoE layers, top-k] on the [B, P+R] grid (``routed_experts``);
-1 marks a position without a route (padding, the last sampled token, a position the engine did not forward):
there the router's own choice stands.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from .packing import ModelInput


class LayerReplay:
    """One MoE layer's stand-in for megatron-core's ``RouterReplay``: ``target`` [tokens, k] in the order the
    router sees its tokens (None: route as the router does); with ``replay`` the target's experts are used, and
    either way the tokens whose own top-k set differs from the target's are counted. With ``record`` the experts
    each forward used are kept in ``recorded`` [tokens, k] (the megatron-core rollout engine's route capture)."""

    def __init__(self, record: bool = False) -> None:
        self.target: Optional[torch.Tensor] = None
        self.replay = False
        self.differ = 0
        self.tokens = 0
        self.record = record
        self.recorded: Optional[torch.Tensor] = None

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        probs, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        probs, chosen = self.route(scores, probs, own)
        if self.record:
            self.recorded = chosen.detach().to(torch.int16)
        return probs, chosen

    def route(self, scores: torch.Tensor, probs: torch.Tensor, own: torch.Tensor):
        """(gate probabilities, experts) of each token given the router's own choice ``own``."""
        if self.target is None:
            return probs, own
        target = self.target.to(scores.device)
        routed = (target >= 0).all(dim=-1)
        same = (own.sort(dim=-1).values == target.sort(dim=-1).values).all(dim=-1)
        self.differ += int((routed & ~same).sum())
        self.tokens += int(routed.sum())
        if not self.replay:
            return probs, own
        chosen = torch.where(routed[:, None], target.long(), own)
        return scores.gather(1, chosen), chosen


def moe_layer_numbers(config) -> List[int]:
    """The global layer numbers (1-based) of the MoE layers, in order (DeepSeek-V3: after its dense layers)."""
    pattern = config.moe_layer_freq
    if not isinstance(pattern, list):
        pattern = [1 if i % pattern == 0 else 0 for i in range(config.num_layers)]
    return [i + 1 for i, moe in enumerate(pattern) if moe]


def moe_routers(chunks) -> Dict[int, object]:
    """{MoE layer number (1-based, the routes' layer axis): its router} of the MoE layers in this rank's chunks."""
    routers = {}
    for chunk in chunks:
        ordinal = {number: i + 1 for i, number in enumerate(moe_layer_numbers(chunk.config))}
        for module in chunk.modules():
            if hasattr(module, "router_replay") and hasattr(module, "layer_number"):
                routers[ordinal[int(module.layer_number)]] = module
    return routers


def install(chunks, record: bool = False) -> Dict[int, LayerReplay]:
    """A :class:`LayerReplay` on every MoE router of ``chunks``, by MoE layer number."""
    replays = {}
    for number, router in moe_routers(chunks).items():
        router.router_replay = replays[number] = LayerReplay(record)
    return replays


def recorded_routes(replays: Dict[int, LayerReplay], inp: ModelInput, layers: int) -> torch.Tensor:
    """The routes the last forward of a single-sequence computed layout (packed, b = 1) used, on the [B, S] grid
    [B, S, ``layers``, k]; -1 where nothing was routed (padding, layers without experts)."""
    k = next(iter(replays.values())).recorded.shape[-1]
    grid = torch.full((*inp.shape, layers, k), -1, dtype=torch.int16)
    for number, layer in replays.items():
        grid[inp.rows, inp.cols, number - 1] = layer.recorded[inp.flat].cpu()
    return grid


def routes_in_computed_layout(
    inp: ModelInput, routes: torch.Tensor, cp_rank: int = 0, tp_rank: int = 0, sp: int = 1
) -> torch.Tensor:
    """Routes on the [B, S] grid ([B, S, L, k]) -> [tokens, L, k] in the order an MoE layer of this rank sees
    its tokens: the computed layout [b, s] (packed or trimmed; with context parallelism this CP rank's
    positions), sequence-first ([s, b] flattened, megatron's), and with sequence parallelism (``sp`` TP ranks)
    this TP rank's slice of the sequence. Positions without a real token get -1 (the router's own choice)."""
    b = inp.input_ids.shape[0]
    s = inp.length if inp.cp_index is not None else inp.input_ids.shape[1]
    layers, k = routes.shape[-2:]
    grid = torch.full((b * s, layers, k), -1, dtype=routes.dtype, device=routes.device)
    grid[inp.flat] = routes[inp.rows, inp.cols]
    grid = grid.view(b, s, layers, k)
    if inp.cp_index is not None:
        grid = grid[:, inp.cp_index[cp_rank]]
    seq_first = grid.transpose(0, 1)  # [s, b, L, k]
    if sp > 1:
        part = seq_first.shape[0] // sp
        seq_first = seq_first[tp_rank * part : (tp_rank + 1) * part]
    return seq_first.reshape(-1, layers, k)


def set_targets(replays: Dict[int, LayerReplay], routes: Optional[torch.Tensor], replay: bool = True) -> None:
    """Each local MoE layer's target from ``routes`` [tokens, L, k], whose layer axis lists the MoE layers (Qwen3-MoE:
    every layer; DeepSeek-V3: those after the dense ones); None: the routers choose on their own."""
    for number, layer in replays.items():
        layer.target = None if routes is None else routes[:, number - 1]
        layer.replay = replay


def take_mismatch(replays: Dict[int, LayerReplay]) -> List[List[int]]:
    """[MoE layer number, tokens whose own top-k differed, tokens compared] per layer since the last call."""
    counts = [[number, layer.differ, layer.tokens] for number, layer in sorted(replays.items())]
    for layer in replays.values():
        layer.differ = layer.tokens = 0
    return counts


def mismatch_metrics(counts: torch.Tensor) -> Dict[str, float]:
    """From [layers, 2] (tokens routed otherwise, tokens compared) summed over the ranks:

        router_replay/mismatch_share       sum_l differ_l / sum_l compared_l
        router_replay/layer_share_max      max_l differ_l / compared_l
        router_replay/layer_share_mean     mean_l differ_l / compared_l
    over the layers that compared tokens ({} when none did)."""
    seen = counts[:, 1] > 0
    if not bool(seen.any()):
        return {}
    share = counts[seen, 0] / counts[seen, 1]
    return {
        "router_replay/mismatch_share": float(counts[seen, 0].sum() / counts[seen, 1].sum()),
        "router_replay/layer_share_max": float(share.max()),
        "router_replay/layer_share_mean": float(share.mean()),
    }
