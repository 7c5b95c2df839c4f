"""Tokens per expert and MoE layer in the rollout (generate_config.eplb_token_collects), counted from the routes
the rollout engine captured (the same capture router replay uses), written to one JSON per run that
``cli/eplb_generate_map.py`` turns into an expert map.

    load[l, e] = number of (token position, choice) pairs the engine routed to expert e in MoE layer l

over the prompt and response tokens of every trained sample (prefill and decode alike; positions the engine did
not forward, such as the last sampled token, have no route).
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Optional

import torch

FORMAT = "mindspeed_rl.expert_load/1"


class ExpertLoad:
    """Running counts of one run, saved after every iteration (atomically: a reader never sees half a file)."""

    def __init__(self, num_layers: int, num_experts: int, path: str, model: str = "", top_k: int = 0):
        self.num_layers, self.num_experts, self.path = num_layers, num_experts, path
        self.model, self.top_k = model, top_k
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.long)
        self.tokens = 0  # token positions with a route
        self.iterations = 0

    @classmethod
    def of_run(cls, gen, actor, run_dir: str) -> Optional["ExpertLoad"]:
        """The counter of generate_config's eplb keys for the actor's model (None: not collected)."""
        if not gen.eplb_token_collects:
            return None
        path = gen.eplb_token_save_path or os.path.join(run_dir, "expert_load.json")
        model = actor.model
        return cls(model.moe_layers, model.num_experts, path, actor.megatron.model, model.moe_router_topk)

    def add(self, routes: torch.Tensor) -> None:
        """One batch's routes, [B, S, L, K] expert ids (-1: no route)."""
        if routes.dim() != 4 or routes.shape[2] != self.num_layers:
            raise ValueError(f"routes of shape {tuple(routes.shape)}; expected [B, S, {self.num_layers}, K]")
        routes = routes.long()
        valid = routes >= 0
        layer = torch.arange(self.num_layers).view(1, 1, -1, 1)
        flat = (layer * self.num_experts + routes)[valid]
        self.counts += torch.bincount(flat, minlength=self.num_layers * self.num_experts).view_as(self.counts)
        self.tokens += int(valid[:, :, 0, 0].sum())
        self.iterations += 1

    def state_dict(self) -> Dict:
        return {"counts": self.counts.tolist(), "tokens": self.tokens, "iterations": self.iterations}

    def load_state_dict(self, state: Optional[Dict]) -> None:
        """A resume continues the counts of the checkpoint's iteration (not those written after it)."""
        if state:
            self.counts = torch.as_tensor(state["counts"], dtype=torch.long)
            self.tokens, self.iterations = int(state["tokens"]), int(state["iterations"])

    def save(self) -> None:
        data = {
            "format": FORMAT,
            "model": self.model,
            "num_moe_layers": self.num_layers,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "iterations": self.iterations,
            "tokens": self.tokens,
            "load": self.counts.tolist(),
        }
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(self.path + ".tmp", self.path)


def read_expert_load(path: str) -> List[List[float]]:
    """The [L][E] load table of a counts file (ValueError naming what is wrong)."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not an expert-load file ({FORMAT}): written by generate_config.eplb_token_collects")
    load = data.get("load")
    if not isinstance(load, list) or not load or not all(isinstance(row, list) and row for row in load):
        raise ValueError("its load table is not [layers][experts]")
    if len({len(row) for row in load}) != 1:
        raise ValueError("its load table is not [layers][experts]: the layers have different numbers of experts")
    return [[_token_count(x, layer, expert) for expert, x in enumerate(row)] for layer, row in enumerate(load)]


def _token_count(value, layer: int, expert: int) -> float:
    """``value`` as a count: a finite number >= 0 (json reads NaN and Infinity; a bool is an int to Python)."""
    count = float(value) if type(value) in (int, float) and abs(value) < 1e300 else math.nan
    if not math.isfinite(count) or count < 0:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
        raise ValueError(f"load[{layer}][{expert}] (MoE layer {layer}, expert {expert}) is {shown}, not a token count")
    return count
