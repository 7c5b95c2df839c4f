"""A model in supervised fine-tuning: the LM head trained on the assistant tokens of instruction data. What it saves
is what a PPO run loads as its actor (``actor_config.load``)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..algorithms.supervised import perplexity, sft_loss, sft_nll_sum
from ..config_cls.ppo_config import RoleConfig
from ..config_cls.rl_config import RLConfig
from ..protocol import WorldSpec
from .base_worker import StageWorker, token_budget

Batch = Dict[str, torch.Tensor]


class SFTWorker(StageWorker):
    def __init__(self, world: WorldSpec, role: RoleConfig, rl: RLConfig, total_steps: int):
        super().__init__(world, role)
        from ..models.engine import MegatronEngine

        self.role, self.rl = role, rl
        self.model = MegatronEngine(
            role, head="lm", trainable=True, total_steps=total_steps, remove_padding=rl.use_remove_padding
        )

    def train_sft(self, rows: Batch, tokens_in_step: int) -> Dict[str, float]:
        """One optimizer step on this DP rank's examples (``sft_rows``); ``tokens_in_step``: the trained tokens of
        the whole step on every DP rank. sft/loss is the step's token mean, sft/ppl its exponential."""

        def loss_fn(outputs, micro):
            return sft_loss(outputs["log_probs"], micro["loss_mask"], tokens_in_step), {}

        budget = token_budget(self.rl, "update")
        step = self.model.train_step(rows, loss_fn, self.role.megatron.micro_batch_size, token_budget=budget)
        return {**self.step_metrics(step, "sft"), "sft/ppl": perplexity(step.loss, 1)}

    def eval_sft(self, rows: Batch) -> Optional[Tuple[float, int]]:
        """(summed NLL, trained tokens) of this DP rank's examples, on its output rank (None on the others)."""
        out = self.model.forward(
            rows, self.role.megatron.micro_batch_size, token_budget=token_budget(self.rl, "update")
        )
        if not self.is_output_rank:
            return None
        return float(sft_nll_sum(out["log_probs"], rows["loss_mask"])), int(rows["loss_mask"].sum())
