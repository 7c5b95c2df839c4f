"""A policy in preference optimisation (DPO, IPO, SimPO) on preference pairs, beside its frozen reference: the
starting model (or ``dpo_config.ref_model``), with LoRA the base model with the adapters off, none for SimPO. What it
saves is what a PPO run loads as its actor."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..algorithms.preference import dpo_loss, dpo_metrics, ipo_loss, simpo_loss
from ..config_cls.dpo_config import DPOConfig
from ..config_cls.ppo_config import RoleConfig
from ..config_cls.rl_config import RLConfig
from ..protocol import LoadedState, WorldSpec
from .base_worker import StageWorker
from .reference import ReferencePolicy

Batch = Dict[str, torch.Tensor]


def answer_logps(log_probs: torch.Tensor, answer_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(summed, mean) log-probability of each row's answer tokens."""
    mask = answer_mask.float()
    sums = (log_probs.float() * mask).sum(1)
    return sums, sums / mask.sum(1).clamp(min=1)


def pair_losses(d: DPOConfig, log_probs: torch.Tensor, rows: Batch) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Per-pair losses of rows (chosen, rejected side by side) and the sums behind TRL's metrics. The length-normalised
    IPO averages each answer's log-ratio over its answer tokens, and its metrics are of those averages (as TRL's)."""
    sums, means = answer_logps(log_probs, rows["answer_mask"])
    if d.dpo_loss_type == "simpo":
        loss = simpo_loss(means[0::2], means[1::2], d.dpo_beta, d.simpo_gamma)
        return loss, dpo_metrics(means[0::2], means[1::2], None, None, d.dpo_beta)
    ref = rows["ref_logps"]
    pair = (sums[0::2], sums[1::2], ref[0::2], ref[1::2])
    if d.dpo_loss_type == "sigmoid":
        return dpo_loss(*pair, d.dpo_beta, d.dpo_label_smoothing), dpo_metrics(*pair, d.dpo_beta)
    if not d.ipo_length_normalized:
        return ipo_loss(*pair, d.dpo_beta), dpo_metrics(*pair, d.dpo_beta)
    tokens = rows["answer_mask"].float().sum(1).clamp(min=1)
    loss = ipo_loss(*pair, d.dpo_beta, tokens[0::2], tokens[1::2])
    averaged = [x / tokens[k::2] for x, k in zip(pair, (0, 1, 0, 1))]
    return loss, dpo_metrics(*averaged, d.dpo_beta)


class DPOWorker(StageWorker):
    def __init__(self, world: WorldSpec, role: RoleConfig, rl: RLConfig, total_steps: int, dpo: DPOConfig):
        super().__init__(world, role)
        from ..models.engine import MegatronEngine

        self.role, self.rl, self.dpo = role, rl, dpo
        padding = rl.use_remove_padding
        self.model = MegatronEngine(role, head="lm", trainable=True, total_steps=total_steps, remove_padding=padding)
        self.reference = ReferencePolicy(role, self.model, padding) if dpo.uses_reference else None  # SimPO: none

    def init_weights(
        self, load: Optional[str], finetune: bool, load_optim: bool, load_rng: bool, iteration: Optional[int] = None
    ) -> LoadedState:
        """The policy as every stage starts it; the reference from dpo_config.ref_model, else the starting model:
        ``load`` on a fresh start, the path a resumed run started from (its trainer state's ``ref_from``), or the
        seeded initialisation of a run that started without a checkpoint."""
        initial = self.reference.initial_weights() if self.reference is not None else None
        state = super().init_weights(load, finetune, load_optim, load_rng, iteration)
        if self.reference is not None:
            self.reference.load(
                initial, self.dpo.ref_model or (load if finetune else state.trainer_state.get("ref_from"))
            )
        return state

    def with_reference(self, rows: Batch) -> Batch:
        """The rows with ``ref_logps``: each row's summed answer log-probability under the reference (SimPO: the
        rows as they are)."""
        if self.reference is None:
            return rows
        with self.reference.in_use() as (engine, _):
            out = engine.forward(rows, 2 * self.role.megatron.micro_batch_size)
        return {**rows, "ref_logps": answer_logps(out["log_probs"], rows["answer_mask"])[0]}

    def train_pairs(self, rows: Batch, pairs_in_step: int) -> Dict[str, float]:
        """One optimizer step on this DP rank's pairs (``dpo_rows``); ``pairs_in_step``: the pairs of the whole step
        on every DP rank. dpo/loss is the step's mean; the TRL metrics are means over its pairs."""
        rows = self.with_reference(rows)

        def loss_fn(outputs, micro):  # each micro-batch's share of the step's means
            loss, sums = pair_losses(self.dpo, outputs["log_probs"], micro)
            return loss.sum() / pairs_in_step, {k: float(v) / pairs_in_step for k, v in sums.items()}

        return self.step_metrics(self.model.train_step(rows, loss_fn, 2 * self.role.megatron.micro_batch_size), "dpo")

    def score_pairs(self, rows: Batch) -> Optional[Tuple[float, Dict[str, float]]]:
        """(summed loss, the TRL metrics' sums) of this DP rank's held-out pairs, on its output rank."""
        rows = self.with_reference(rows)
        out = self.model.forward(rows, 2 * self.role.megatron.micro_batch_size)
        if not self.is_output_rank:
            return None
        loss, sums = pair_losses(self.dpo, out["log_probs"], rows)
        return float(loss.sum()), {k: float(v) for k, v in sums.items()}
