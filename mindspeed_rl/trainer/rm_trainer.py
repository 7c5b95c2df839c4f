"""Reward-model training (cli/train_rm.py): one optimizer step of Bradley-Terry loss per global batch of preference
pairs, held-out pair accuracy every test_freq steps, checkpoints the PPO reward worker loads. The loop:

    1. the next global batch of pairs (PromptSampler: the data position is the only run state a resume needs)
    2. each DP rank's share as rows (prompt + chosen, prompt + rejected, side by side)
    3. one optimizer step on every rank (the workers' ``train_pairs``), its metrics
    4. validation when due, the console line and metrics.jsonl, the guards, the save when due
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ..algorithms.preference import preference_metrics
from ..config_cls.rm_config import RMConfig
from ..datasets.pairs import pair_rows
from ..utils.cli import raise_if_terminated
from .guards import save_due, stop_on_nonfinite_steps


class RewardModelTrainer:
    def __init__(self, cfg: RMConfig, group, dataset, sampler, logger, start_iteration: int = 0, test_dataset=None):
        self.cfg, self.m = cfg, cfg.reward.megatron
        self.group, self.dataset, self.sampler, self.logger = group, dataset, sampler, logger
        self.test_items = [test_dataset[i] for i in range(len(test_dataset))] if test_dataset is not None else None
        self.iteration = start_iteration
        self.history: List[Dict[str, float]] = []

    def fit(self) -> List[Dict[str, float]]:
        if self.cfg.rl.val_before_train and self.test_items:
            metrics = {"iteration": self.iteration, **self.validate()}
            print("validation before training: " + describe(metrics), flush=True)
            self.logger.record(metrics)
        while self.iteration < self.m.train_iters:
            raise_if_terminated()
            started = time.perf_counter()
            items = [self.dataset[i] for i in self.sampler.next_batch()]
            metrics = self.train_step(items)
            metrics["timing/update"] = time.perf_counter() - started
            self.iteration += 1
            if self.validation_due():
                t0 = time.perf_counter()
                metrics.update(self.validate())
                metrics["timing/validation"] = time.perf_counter() - t0
            metrics["timing/all"] = time.perf_counter() - started
            metrics = {"iteration": self.iteration, **metrics}
            self.logger.log(metrics)
            self.history.append(metrics)
            stop_on_nonfinite_steps(metrics, self.cfg.rl.max_nonfinite_steps, self.iteration)
            if save_due(metrics, 0, self.iteration, 0, self.m):
                self.save()
        return self.history

    def train_step(self, items: Sequence[Dict]) -> Dict[str, float]:
        """One optimizer step on ``items`` (every rank of DP group d gets the d-th contiguous share)."""
        shares = np.array_split(np.arange(len(items)), self.group.dp_size)
        per_dp = [pair_rows([items[i] for i in share]) for share in shares]
        metrics = dict(self.group.call_per_dp("train_pairs", per_dp, (len(items),))[self.group.output_ranks()[0]])
        metrics["rm/tokens"] = float(sum(int(rows["attention_mask"].sum()) for rows in per_dp))
        return metrics

    def validation_due(self) -> bool:
        if not self.test_items:
            return False
        last = self.iteration == self.m.train_iters
        return last or (self.cfg.rl.test_freq > 0 and self.iteration % self.cfg.rl.test_freq == 0)

    def validate(self) -> Dict[str, float]:
        """The held-out pairs scored with the current weights: val/rm/accuracy (a tie counts as wrong),
        val/rm/margin, val/rm/chosen, val/rm/rejected."""
        items = self.test_items or []
        shares = np.array_split(np.arange(len(items)), self.group.dp_size)
        answers = self.group.call_per_dp("score_pairs", [pair_rows([items[i] for i in s]) for s in shares], ())
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

    def trainer_state(self) -> Dict:
        return {"iteration": self.iteration, "consumed_samples": self.sampler.consumed_samples}

    def load_trainer_state(self, state: Dict) -> None:
        self.sampler.consumed_samples = int(state.get("consumed_samples", 0))

    def save(self) -> Optional[str]:
        m = self.m
        if not m.save:
            return None
        start = time.perf_counter()
        extra = {"trainer_state": self.trainer_state()}
        hf = self.group.call("save", m.save, self.iteration, extra, not m.no_save_optim, not m.no_save_rng)[0]
        print(
            f"saved iteration {self.iteration}: reward model -> {m.save}"
            + (f"; HF (--orm form): {hf}" if hf else "")
            + f" ({time.perf_counter() - start:.1f}s)",
            flush=True,
        )
        return hf


def describe(metrics: Dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if k.startswith("val/"))
