"""An outcome reward model (ORM): frozen LM trunk + value head; the head's output at the last
valid token scores the whole response."""

from __future__ import annotations

from ..config_cls.ppo_config import RoleConfig
from ..config_cls.rl_config import RLConfig
from ..protocol import Experience, ForwardAnswer, LoadedState
from .base_worker import MegatronWorker, token_budget


class RewardWorker(MegatronWorker):
    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        role: RoleConfig,
        rl: RLConfig,
        threads: int,
    ):
        m = role.megatron
        super().__init__(rank, world_size, master_addr, master_port, m, threads, seed_offset=13)
        from ..models.engine import MegatronEngine

        self.role, self.rl = role, rl
        self.model = MegatronEngine(role, head="value", trainable=False, remove_padding=rl.use_remove_padding)

    def init_weights(self, load: str) -> LoadedState:
        from ..checkpoint.engine_io import load_weights_only

        if not load:
            raise ValueError(
                "reward_config.load is required: a reward model must be trained weights "
                "(convert one with cli/convert_ckpt.py --orm)"
            )
        load_weights_only(self.model, load)
        return LoadedState()

    def compute_scores(self, rows: Experience) -> ForwardAnswer:
        """Score [B] of each sequence: the value head at its last valid token."""
        from ..models.heads import last_token_values

        out = self.model.forward(
            rows.tensors(), self.rl.ref_forward_micro_batch_size, token_budget=token_budget(self.rl, "ref")
        )
        scores = last_token_values(out["raw_values"], rows.attention_mask) if self.is_output_rank else None
        return ForwardAnswer(scores)
