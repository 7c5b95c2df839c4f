"""A reward model in training: LM trunk + value head fitted to preference pairs (Bradley-Terry). What it saves is
what the PPO reward worker loads (``reward_config.load``) and the converter exports with ``--orm``."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..algorithms.preference import bradley_terry_loss
from ..config_cls.ppo_config import RoleConfig
from ..config_cls.rl_config import RLConfig
from ..datasets.pairs import split_pair_scores
from ..protocol import WorldSpec
from .base_worker import StageWorker

Batch = Dict[str, torch.Tensor]


class RewardModelWorker(StageWorker):
    def __init__(self, world: WorldSpec, role: RoleConfig, rl: RLConfig, total_steps: int):
        m = role.megatron
        super().__init__(world, role, seed_offset=13)
        from ..models.engine import MegatronEngine

        self.role, self.rl = role, rl
        self.model = MegatronEngine(
            role,
            head="value",
            trainable=True,
            total_steps=total_steps,
            value_head_init_std=m.init_method_std,
            remove_padding=rl.use_remove_padding,
        )

    def train_pairs(self, rows: Batch, pairs_in_step: int) -> Dict[str, float]:
        """One optimizer step on this DP rank's pairs (``pair_rows``: chosen and rejected side by side, so a
        micro-batch of micro_batch_size pairs is 2 x that many rows); ``pairs_in_step``: the pairs of the whole
        step on every DP rank. Metrics are means over the step's pairs:

            rm/loss      mean_i -log sigmoid(r_c,i - r_r,i)
            rm/accuracy  mean_i 1[r_c,i > r_r,i]
            rm/margin    mean_i (r_c,i - r_r,i),  rm/chosen, rm/rejected: mean rewards
        """
        from ..models.heads import last_token_values

        def loss_fn(outputs, micro):  # each micro-batch's share of the step's means
            chosen, rejected = split_pair_scores(last_token_values(outputs["raw_values"], micro["attention_mask"]))
            chosen, rejected = chosen.float(), rejected.float()
            loss = bradley_terry_loss(chosen, rejected).sum() / pairs_in_step
            detached_c, detached_r = chosen.detach(), rejected.detach()
            return loss, {
                "rm/accuracy": float((detached_c > detached_r).sum()) / pairs_in_step,
                "rm/margin": float((detached_c - detached_r).sum()) / pairs_in_step,
                "rm/chosen": float(detached_c.sum()) / pairs_in_step,
                "rm/rejected": float(detached_r.sum()) / pairs_in_step,
            }

        return self.step_metrics(self.model.train_step(rows, loss_fn, 2 * self.role.megatron.micro_batch_size), "rm")

    def score_pairs(self, rows: Batch) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(chosen, rejected) rewards of this DP rank's pairs, on its output rank (None on the others)."""
        from ..models.heads import last_token_values

        out = self.model.forward(rows, 2 * self.role.megatron.micro_batch_size)
        if not self.is_output_rank:
            return None
        return split_pair_scores(last_token_values(out["raw_values"].float(), rows["attention_mask"]))
