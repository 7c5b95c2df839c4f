"""The frozen reference of a trained policy, one component for PPO's integrated actor and the DPO stage.

It is an engine of its own holding the starting weights (optionally parked on host between its forwards), or, with
LoRA, the policy itself with its adapters off: the base weights, no second model. Its weights come from, in order,
an explicit origin (``integrated_mode_config.ref_model_load_path``, ``dpo_config.ref_model``, or what a resumed run
recorded it started from), else the policy's weights before any checkpoint is loaded."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from ..config_cls.run_config import RoleConfig


class ReferencePolicy:
    def __init__(self, role: RoleConfig, policy, remove_padding: bool, park_on_host: bool = False) -> None:
        """``policy``: the trained MegatronEngine; ``park_on_host``: the reference's weights wait on host between
        its forwards (PPO's integrated actor, whose devices the policy and the rollout engine share)."""
        from ..models.engine import MegatronEngine
        from ..models.offload import Offloader

        self.policy = policy
        own = policy.lora is None
        self.engine = MegatronEngine(role, head="lm", trainable=False, remove_padding=remove_padding) if own else None
        self.parking = Offloader(self.engine) if own and park_on_host else None

    def initial_weights(self) -> Optional[Dict[str, torch.Tensor]]:
        """A copy of the policy's weights now (before a checkpoint loads over them), for a reference of its own."""
        if self.engine is None:
            return None
        return {k: v.detach().clone() for k, v in self.policy.named_weights()}

    def load(self, initial: Optional[Dict[str, torch.Tensor]], origin: Optional[str]) -> None:
        """The reference's weights: ``initial``, then ``origin``'s (a checkpoint folder) over them when given (a
        buffer the checkpoint does not hold keeps the policy's value)."""
        if self.engine is None:
            return
        from ..checkpoint.engine_io import load_weights_only

        self.engine.load_weights(initial)
        if origin:
            load_weights_only(self.engine, origin)
        if self.parking is not None:
            self.parking.offload(grads=False, optimizer=False)

    @contextlib.contextmanager
    def in_use(self) -> Iterator[Tuple[Any, Dict[str, float]]]:
        """(the engine to run the reference's forward on, timing): the reference's own engine, on the device for the
        forward (timing/ref_onload, timing/ref_offload when parked), or the policy with its adapters off."""
        timing: Dict[str, float] = {}
        if self.engine is None:
            from ..models.lora import adapters_disabled

            with adapters_disabled(self.policy.lora):
                yield self.policy, timing
            return
        if self.parking is not None:
            start = time.perf_counter()
            self.parking.onload()
            timing["timing/ref_onload"] = time.perf_counter() - start
        try:
            yield self.engine, timing
        finally:
            if self.parking is not None:
                start = time.perf_counter()
                self.parking.offload(grads=False, optimizer=False)
                timing["timing/ref_offload"] = time.perf_counter() - start
