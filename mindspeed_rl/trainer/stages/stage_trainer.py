"""The loop every single-role stage shares (reward-model training, SFT): one optimizer step per global batch,
held-out metrics every test_freq steps, checkpoints a PPO run loads. A stage says how a batch trains
(``train_step``), how the held-out set is measured (``validate``) and how its dataset is opened.

    1. the next global batch (PromptSampler: the data position is the only run state a resume needs)
    2. one optimizer step on every rank, its metrics
    3. validation when due, the console line and metrics.jsonl, the guards, the save when due
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from ...config_cls.stage_config import StageConfig
from ...utils.cli import raise_if_terminated
from ..runtime.guards import save_due, stop_on_nonfinite_steps


class StageTrainer:
    def __init__(self, cfg: StageConfig, group, dataset, sampler, logger, start_iteration: int = 0, test_dataset=None):
        self.cfg, self.m = cfg, cfg.role.megatron
        self.group, self.dataset, self.sampler, self.logger = group, dataset, sampler, logger
        self.test_items = [test_dataset[i] for i in range(len(test_dataset))] if test_dataset is not None else None
        self.iteration = start_iteration
        self.history: List[Dict[str, float]] = []

    @classmethod
    def open_dataset(cls, prefix: str, key: str, seq_length: int):
        raise NotImplementedError

    def train_step(self, items: Sequence[Dict]) -> Dict[str, float]:
        raise NotImplementedError

    def validate(self) -> Dict[str, float]:
        raise NotImplementedError

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

    def shares(self, items: Sequence[Dict]) -> List[List[Dict]]:
        """Data-parallel rank d's items: the d-th contiguous share."""
        return [[items[i] for i in share] for share in np.array_split(np.arange(len(items)), self.group.dp_size)]

    def validation_due(self) -> bool:
        if not self.test_items:
            return False
        last = self.iteration == self.m.train_iters
        return last or (self.cfg.rl.test_freq > 0 and self.iteration % self.cfg.rl.test_freq == 0)

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
        form = " (--orm form)" if self.cfg.stage.head == "value" else ""
        print(
            f"saved iteration {self.iteration}: {self.cfg.stage.role} -> {m.save}"
            + (f"; HF{form}: {hf}" if hf else "")
            + f" ({time.perf_counter() - start:.1f}s)",
            flush=True,
        )
        return hf


def describe(metrics: Dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if k.startswith("val/"))
