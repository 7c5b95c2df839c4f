"""The on-policy distillation teacher: a frozen LM of its own size and layout that scores every token the student
sampled. Colocated with the actor, its weights wait on host between its forwards where the device offloads."""

from __future__ import annotations

import time

from ..config_cls.ppo_config import RoleConfig
from ..config_cls.rl_config import RLConfig
from ..protocol import Experience, ForwardAnswer, LoadedState, response_part
from .base_worker import MegatronWorker, token_budget


class TeacherWorker(MegatronWorker):
    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        role: RoleConfig,
        rl: RLConfig,
        threads: int,
        offload_when_idle: bool = False,
    ):
        super().__init__(rank, world_size, master_addr, master_port, role.megatron, threads, seed_offset=17)
        from ..models.engine import MegatronEngine
        from ..models.offload import Offloader

        self.role, self.rl = role, rl
        self.model = MegatronEngine(role, head="lm", trainable=False, remove_padding=rl.use_remove_padding)
        self.offloader = Offloader(self.model) if offload_when_idle else None

    def init_weights(self, load: str) -> LoadedState:
        from ..checkpoint.engine_io import load_weights_only

        load_weights_only(self.model, load)
        if self.offloader is not None:
            self.offloader.offload(grads=False, optimizer=False)
        return LoadedState()

    def compute_log_prob(self, rows: Experience) -> ForwardAnswer:
        """Log-probs [B, R] of the response tokens under the teacher's own distribution (temperature 1: the
        student is pushed toward the teacher as it is, whatever temperature the student samples at)."""
        timing = {}
        if self.offloader is not None:
            t0 = time.perf_counter()
            self.offloader.onload()
            timing["timing/teacher_onload"] = time.perf_counter() - t0
        out = self.model.forward(
            rows.tensors(), self.role.megatron.micro_batch_size, token_budget=token_budget(self.rl, "ref")
        )
        if self.offloader is not None:
            t0 = time.perf_counter()
            self.offloader.offload(grads=False, optimizer=False)
            timing["timing/teacher_offload"] = time.perf_counter() - t0
        part = response_part(out["log_probs"], rows.prompt_width, rows.response_width) if self.is_output_rank else None
        return ForwardAnswer(part, timing)
