"""The critic: a value model (LM trunk + hidden->1 head) trained on the returns."""

from __future__ import annotations

import time
from typing import Dict, List, Optional

from ..algorithms.losses import LossScale, value_loss
from ..config_cls.ppo_config import RoleConfig
from ..config_cls.rl_config import RLConfig
from ..features.algorithm import resolve_algorithm
from ..protocol import Experience, ForwardAnswer, LoadedState, MiniBatch, WorldSpec, response_part
from .base_worker import (
    MegatronWorker,
    load_trainable,
    save_trainable,
    shares_cores,
    token_budget,
    train_on_mini_batches,
)
from .profiling import StageProfiler, profiled


class CriticWorker(MegatronWorker):
    def __init__(
        self, world: WorldSpec, role: RoleConfig, rl: RLConfig, total_steps: int, offload_when_idle: bool = False
    ):
        m = role.megatron
        super().__init__(world, role, seed_offset=7)
        from ..models.engine import MegatronEngine
        from ..models.offload import Offloader

        self.role, self.rl = role, rl
        self.loss_agg_mode = resolve_algorithm(rl).loss_agg_mode
        self.critic = MegatronEngine(
            role,
            head="value",
            trainable=True,
            total_steps=total_steps,
            value_head_init_std=m.init_method_std,
            remove_padding=rl.use_remove_padding,
        )
        self.offloader = Offloader(self.critic)
        self.offload_when_idle = offload_when_idle
        self.profiling = StageProfiler(self.acc, "critic", world.rank, role.profiler)

    def init_weights(
        self, load: Optional[str], finetune: bool, load_optim: bool, load_rng: bool, iteration: Optional[int] = None
    ) -> LoadedState:
        state = load_trainable(self.critic, load, finetune, load_optim, load_rng, iteration)
        self._idle()
        return state

    def save(self, ckpt_dir: str, iteration: int, extra: Dict, save_optim: bool, save_rng: bool) -> Optional[str]:
        """The checkpoint of ``iteration``; with save_hf also its HF folder in the --orm form (the path)."""
        self._busy()
        path = save_trainable(self.critic, ckpt_dir, iteration, extra, save_optim, save_rng)
        self._idle()
        return path

    def _busy(self) -> None:
        if self.offload_when_idle:
            self.offloader.onload()

    def _idle(self) -> None:
        """The critic shares the actor's devices: get out of the way while the actor works."""
        if self.offload_when_idle:
            self.offloader.offload()

    @shares_cores
    @profiled("critic_compute_values")
    def compute_values(self, rows: Experience) -> ForwardAnswer:
        """Values [B, R] of the response positions."""
        t0 = time.perf_counter()
        self._busy()
        out = self.critic.forward(
            self.inputs(rows), self.rl.actor_forward_micro_batch_size, token_budget=token_budget(self.rl, "actor")
        )
        self._idle()
        values = response_part(out["values"], rows.prompt_width, rows.response_width) if self.is_output_rank else None
        return ForwardAnswer(values, {"timing/critic_forward": time.perf_counter() - t0})

    @shares_cores
    @profiled("critic_update")
    def update(self, mini_batches: List[MiniBatch]) -> Dict[str, float]:
        mode = self.loss_agg_mode

        def make_loss(rows: Experience, scale: LossScale):
            def loss_fn(outputs, micro):
                values = response_part(outputs["values"], rows.prompt_width, rows.response_width)
                loss, m = value_loss(
                    values, micro["values"], micro["returns"], micro["loss_mask"], self.rl.cliprange_value, mode, scale
                )
                return loss, {"critic/vf_loss": float(loss), "critic/vf_clipfrac": float(m["vf_clipfrac"])}

            return loss_fn

        self._busy()
        metrics = train_on_mini_batches(
            self.critic,
            mini_batches,
            make_loss,
            self.role.megatron.micro_batch_size,
            "critic",
            token_budget=token_budget(self.rl, "update"),
            encoder=self.image_encoder,
        )
        self._idle()
        return metrics
