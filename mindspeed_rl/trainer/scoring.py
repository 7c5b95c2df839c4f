"""Sequence scores of an experience: rule verifiers, the reward model, DAPO's overlong punishment."""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import torch

from ..algorithms.shaping import overlong_penalty
from ..protocol import Experience
from ..utils.clock import Clock
from .prompts import decode_responses


class Scorer:
    """``scorer(exp, clock)`` sets ``exp.scores`` and returns the metrics and each verifier's values; the
    rollout source calls it on every group it offers to its filter."""

    def __init__(self, cfg, reward_runner, reward_model, tokenizer) -> None:
        self.rl, self.max_tokens = cfg.rl, cfg.generate.sampling_config.max_tokens
        self.reward_runner, self.reward_model, self.tokenizer = reward_runner, reward_model, tokenizer

    def __call__(self, exp: Experience, clock: Clock) -> Tuple[Dict[str, float], Dict[str, torch.Tensor]]:
        rl = self.rl
        scores = torch.zeros(exp.num_rows)
        metrics: Dict[str, float] = {}
        per_verifier: Dict[str, torch.Tensor] = {}
        if rl.rule_reward:
            with clock.measure("timing/rule_reward"):
                per_verifier, metrics = self.verify(exp)
            scores = scores + self.reward_runner.weighted(per_verifier)
        if self.reward_model is not None:
            with clock.measure("timing/reward_model"):
                rm = self.reward_model_scores(exp)
            metrics["reward_model/score/mean"] = float(rm.mean())
            scores = scores + rl.reward_model_weight * rm.float()
        if rl.overlong_buffer_enable:
            limit = rl.rollout_max_tokens or self.max_tokens
            penalty = overlong_penalty(
                exp.response_mask.sum(1), limit, rl.overlong_buffer, rl.overlong_buffer_penalty_factor
            )
            metrics["overlong/penalty_mean"] = float(penalty.mean())
            metrics["overlong/penalised_share"] = float((penalty < 0).float().mean())
            scores = scores + penalty
        exp.set("scores", scores)
        return metrics, per_verifier

    def reward_model_scores(self, exp: Experience) -> torch.Tensor:
        """The reward model's score per row. The rollout source scores the groups it offers, which need not
        split over the reward model's data-parallel ranks: the rows are padded with repeats, the repeats'
        scores dropped."""
        rows, dp = exp.num_rows, self.reward_model.dp_size
        padded = exp if rows % dp == 0 else exp.select(np.arange(rows + (-rows) % dp) % rows)
        answer = self.reward_model.forward("compute_scores", padded, balance=self.rl.use_dp_batch_balance)
        return answer.per_row[:rows]

    def verify(self, exp: Experience) -> Tuple[Dict[str, torch.Tensor], Dict[str, float]]:
        """Each rule verifier's value for every response (decoded without out-of-vocabulary ids, counted in
        rollout/out_of_vocab_tokens), and the verifier metrics. What is scored is the model's own words
        (loss_mask): tool results in a trajectory are not the model's answer."""
        texts, outside = decode_responses(self.tokenizer, exp.response_ids, exp.loss_mask)
        per_verifier, metrics = self.reward_runner.score_each(texts, exp.labels)
        metrics["rollout/out_of_vocab_tokens"] = float(outside)
        return per_verifier, metrics
