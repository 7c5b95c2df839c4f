"""Preference optimisation (cli/train_dpo.py): one optimizer step of DPO, IPO or SimPO loss per global batch of
preference pairs (each DP rank's share as rows: prompt + chosen, prompt + rejected, side by side, with the answers'
reference log-probabilities), the held-out pairs' loss and TRL metrics every test_freq steps; the loop is the
stages' (stage_trainer.py)."""

from __future__ import annotations

from typing import Dict, Sequence

from ...datasets.pairs import dpo_rows
from .rm_trainer import RewardModelTrainer


class DPOTrainer(RewardModelTrainer):
    """Pairs are opened as for reward-model training; the reference's origin is run state (a resume keeps it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        dpo, m = self.cfg.dpo, self.m
        self.ref_from = (dpo.ref_model if dpo else "") or (m.load if m.load and m.finetune else "")

    def train_step(self, items: Sequence[Dict]) -> Dict[str, float]:
        per_dp = [dpo_rows(share) for share in self.shares(items)]
        metrics = dict(self.group.call_per_dp("train_pairs", per_dp, (len(items),))[self.group.output_ranks()[0]])
        metrics["dpo/tokens"] = float(sum(int(rows["attention_mask"].sum()) for rows in per_dp))
        return metrics

    def validate(self) -> Dict[str, float]:
        """The held-out pairs with the current weights: val/dpo/loss and val/<TRL metric> (means over the pairs)."""
        items = self.test_items or []
        answers = self.group.call_per_dp("score_pairs", [dpo_rows(s) for s in self.shares(items)], ())
        parts = [answers[r] for r in self.group.output_ranks()]
        pairs = max(1, len(items))
        metrics = {"val/dpo/loss": sum(p[0] for p in parts) / pairs}
        for key in parts[0][1]:
            metrics[f"val/{key}"] = sum(p[1][key] for p in parts) / pairs
        return metrics

    def trainer_state(self) -> Dict:
        return {**super().trainer_state(), "ref_from": self.ref_from}

    def load_trainer_state(self, state: Dict) -> None:
        super().load_trainer_state(state)
        self.ref_from = state.get("ref_from", self.ref_from)
