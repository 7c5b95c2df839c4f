"""The on-policy distillation teacher: a frozen LM of its own size and layout that scores every token the student
sampled. Colocated with the actor, its weights wait on host between its forwards where the device offloads."""

from __future__ import annotations

from ..protocol import Experience, ForwardAnswer, response_part
from .base_worker import FrozenModelWorker


class TeacherWorker(FrozenModelWorker):
    head = "lm"
    seed_offset = 17

    def compute_log_prob(self, rows: Experience) -> ForwardAnswer:
        """Log-probs [B, R] of the response tokens under the teacher's own distribution (temperature 1: the
        student is pushed toward the teacher as it is, whatever temperature the student samples at)."""
        out, timing = self.forward_rows(rows, self.role.megatron.micro_batch_size)
        part = response_part(out["log_probs"], rows.prompt_width, rows.response_width) if self.is_output_rank else None
        return ForwardAnswer(part, timing)
