"""Sequence scores of an experience: rule verifiers, the reward model, the generative judge, DAPO's overlong
punishment."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ...algorithms.shaping import overlong_penalty
from ...protocol import Experience
from ...utils.clock import Clock
from .prompts import decode_known, decode_responses

Judged = Tuple[torch.Tensor, Dict[str, float]]  # the judge's scores in [0, 1] per row, and its metrics


class Scorer:
    """``scorer(exp, clock)`` sets ``exp.scores`` and returns the metrics and each verifier's values; the
    rollout source calls it on every group it offers to its filter. With a judge, ``submit_judge(exp)`` starts
    the judge's part in a thread of its own (the rollout source submits finished groups while others still
    generate) and ``scorer(exp, clock, judged)`` takes its result."""

    def __init__(self, cfg, reward_runner, reward_model, tokenizer, judge=None) -> None:
        self.rl, self.max_tokens = cfg.rl, cfg.generate.sampling_config.max_tokens
        self.reward_runner, self.reward_model, self.tokenizer = reward_runner, reward_model, tokenizer
        self.judge, self.judge_weight = judge, cfg.judge.weight if judge is not None else 0.0
        self.judge_overlap = judge is not None and cfg.judge.overlap
        self._judge_thread: Optional[ThreadPoolExecutor] = None

    def submit_judge(self, exp: Experience) -> "Future[Judged]":
        """The judge's verdicts on ``exp``'s responses, asked in the judge's thread."""
        if self._judge_thread is None:
            self._judge_thread = ThreadPoolExecutor(1, thread_name_prefix="judge")
        prompts, responses, labels = self.judge_inputs(exp)
        return self._judge_thread.submit(self._judge, prompts, responses, labels)

    def _judge(self, prompts: List[str], responses: List[str], labels: List[str]) -> Judged:
        verdicts, metrics = self.judge.grade(prompts, responses, labels)
        return torch.tensor([v.score for v in verdicts], dtype=torch.float32), metrics

    def judge_inputs(self, exp: Experience) -> Tuple[List[str], List[str], List[str]]:
        """(prompt, response, label) texts of every row: what the judge's template shows it."""
        width = exp.prompt_width
        prompts = [
            decode_known(self.tokenizer, ids[:width][mask[:width].bool()].tolist())[0]
            for ids, mask in zip(exp.input_ids, exp.attention_mask)
        ]
        responses, _ = decode_responses(self.tokenizer, exp.response_ids, exp.loss_mask)
        labels = [str(label) if label is not None else "" for label in (exp.labels or [""] * exp.num_rows)]
        return prompts, responses, labels

    def close(self) -> None:
        if self._judge_thread is not None:
            self._judge_thread.shutdown(wait=False, cancel_futures=True)  # a request in flight ends at its timeout
        if self.judge is not None:
            self.judge.close()

    def __call__(
        self, exp: Experience, clock: Clock, judged: "Optional[Future[Judged]]" = None
    ) -> Tuple[Dict[str, float], Dict[str, torch.Tensor]]:
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
        if self.judge is not None:
            if judged is None:
                with clock.measure("timing/judge"):
                    judge_scores, judge_metrics = self._judge(*self.judge_inputs(exp))
            else:  # asked in the judge's thread: its own time is timing/judge, the wait here timing/judge_wait
                with clock.measure("timing/judge_wait"):
                    judge_scores, judge_metrics = judged.result()
                clock.add("timing/judge", judge_metrics["timing/judge"])
            metrics.update({k: v for k, v in judge_metrics.items() if k != "timing/judge"})
            scores = scores + self.judge_weight * judge_scores
        if exp.episode_rewards is not None:  # outside agents' own (openai_agent); NaN: none posted
            posted = ~torch.isnan(exp.episode_rewards)
            metrics["episode/reward/mean"] = float(exp.episode_rewards[posted].mean()) if posted.any() else 0.0
            scores = scores + torch.nan_to_num(exp.episode_rewards, nan=0.0)
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
