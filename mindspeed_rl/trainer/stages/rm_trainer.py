"""Reward-model training (cli/train_rm.py): one optimizer step of Bradley-Terry loss per global batch of preference
pairs (each DP rank's share as rows: prompt + chosen, prompt + rejected, side by side), held-out pair accuracy
every test_freq steps; the loop is the stages' (stage_trainer.py)."""

from __future__ import annotations

from typing import Dict, Sequence

import torch

from ...algorithms.preference import preference_metrics
from ...datasets.pairs import pair_rows
from .stage_trainer import StageTrainer


class RewardModelTrainer(StageTrainer):
    @classmethod
    def open_dataset(cls, prefix: str, key: str, seq_length: int):
        """Pairs whose prompt and longer answer fit seq_length."""
        from ...datasets.pairs import PAIR_FIELDS
        from ...datasets.prompt_dataset import PromptDataset

        return PromptDataset(prefix, (), key=key, token_fields=PAIR_FIELDS, max_length=seq_length)

    def train_step(self, items: Sequence[Dict]) -> Dict[str, float]:
        """One optimizer step on ``items`` (every rank of DP group d gets the d-th contiguous share)."""
        per_dp = [pair_rows(share) for share in self.shares(items)]
        metrics = dict(self.group.call_per_dp("train_pairs", per_dp, (len(items),))[self.group.output_ranks()[0]])
        metrics["rm/tokens"] = float(sum(int(rows["attention_mask"].sum()) for rows in per_dp))
        return metrics

    def validate(self) -> Dict[str, float]:
        """The held-out pairs scored with the current weights: val/rm/accuracy (a tie counts as wrong),
        val/rm/margin, val/rm/chosen, val/rm/rejected."""
        answers = self.group.call_per_dp("score_pairs", [pair_rows(s) for s in self.shares(self.test_items or [])], ())
        ranks = self.group.output_ranks()
        chosen = torch.cat([answers[r][0] for r in ranks])
        rejected = torch.cat([answers[r][1] for r in ranks])
        got = preference_metrics(chosen, rejected)
        return {
            "val/rm/accuracy": got["accuracy"],
            "val/rm/margin": got["margin_mean"],
            "val/rm/chosen": got["chosen_mean"],
            "val/rm/rejected": got["rejected_mean"],
        }
