"""An outcome reward model (ORM): frozen LM trunk + value head; the head's output at the last
valid token scores the whole response."""

from __future__ import annotations

from ..protocol import Experience, ForwardAnswer, LoadedState
from .base_worker import FrozenModelWorker


class RewardWorker(FrozenModelWorker):
    head = "value"
    seed_offset = 13

    def init_weights(self, load: str) -> LoadedState:
        if not load:
            raise ValueError(
                "reward_config.load is required: a reward model must be trained weights "
                "(convert one with cli/convert_ckpt.py --orm)"
            )
        return super().init_weights(load)

    def compute_scores(self, rows: Experience) -> ForwardAnswer:
        """Score [B] of each sequence: the value head at its last valid token."""
        from ..models.heads import last_token_values

        out, timing = self.forward_rows(rows, self.rl.ref_forward_micro_batch_size)
        scores = last_token_values(out["raw_values"], rows.attention_mask) if self.is_output_rank else None
        return ForwardAnswer(scores, timing)
