"""Supervised fine-tuning (cli/train_sft.py): one optimizer step of the assistant tokens' mean negative
log-likelihood per global batch of examples, held-out loss and perplexity every test_freq steps; the loop is the
stages' (stage_trainer.py)."""

from __future__ import annotations

from typing import Dict, Sequence

from ...algorithms.supervised import perplexity
from ...datasets.conversations import sft_rows
from .stage_trainer import StageTrainer

SFT_FIELDS = ("loss_mask",)


class SFTTrainer(StageTrainer):
    @classmethod
    def open_dataset(cls, prefix: str, key: str, seq_length: int):
        """Examples of at most seq_length tokens."""
        from ...datasets.prompt_dataset import PromptDataset

        return PromptDataset(prefix, (), max_prompt_length=seq_length, key=key, token_fields=SFT_FIELDS)

    def train_step(self, items: Sequence[Dict]) -> Dict[str, float]:
        """One optimizer step on ``items`` (every rank of DP group d gets the d-th contiguous share)."""
        per_dp = [sft_rows(share) for share in self.shares(items)]
        tokens = sum(int(rows["loss_mask"].sum()) for rows in per_dp)
        metrics = dict(self.group.call_per_dp("train_sft", per_dp, (tokens,))[self.group.output_ranks()[0]])
        metrics["sft/tokens"] = float(tokens)
        metrics["sft/sequence_tokens"] = float(sum(int(rows["attention_mask"].sum()) for rows in per_dp))
        return metrics

    def validate(self) -> Dict[str, float]:
        """The held-out examples with the current weights: val/sft/loss (mean over their trained tokens) and
        val/sft/ppl."""
        answers = self.group.call_per_dp("eval_sft", [sft_rows(s) for s in self.shares(self.test_items or [])], ())
        parts = [answers[r] for r in self.group.output_ranks()]
        nll, tokens = sum(p[0] for p in parts), sum(p[1] for p in parts)
        return {"val/sft/loss": nll / max(1, tokens), "val/sft/ppl": perplexity(nll, tokens)}
