"""Where the trainer's batches come from, built in one place: the rollout service in front of the engines, the
scorer (verifiers, reward model, judge), the rollout source over both, and the prompt sampler whose position a
checkpoint keeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config_cls.ppo_config import PPOConfig
from ...rollout.service import ColocatedRollout
from ...rollout.source.rollout_source import RolloutSource
from .scoring import Scorer


@dataclass
class Batches:
    service: Any  # rollout/service.py: ColocatedRollout or DisaggregatedRollout
    scorer: Scorer
    source: RolloutSource
    sampler: Any  # datasets/prompt_dataset.PromptSampler (or a test's stand-in)

    def close(self) -> None:
        """The source's threads (the tool thread; the production thread is a daemon) and the judge's."""
        self.source.close()
        self.scorer.close()


def build_batches(
    cfg: PPOConfig,
    actor_group,
    dataset,
    sampler,
    tokenizer,
    reward_runner=None,
    reward_group=None,
    judge=None,
    service=None,
    start_iteration: int = 0,
    run_dir: str = "",
) -> Batches:
    """The service (the actor's own engines unless ``service`` is given: the rollout workers), holding the weights
    of ``start_iteration``; the scorer; the source that stacks rollout function, scoring stage, group filter and
    schedule (rollout/source/rollout_source.py)."""
    service = service or ColocatedRollout(actor_group)
    service.update_weights(start_iteration)
    scorer = Scorer(cfg, reward_runner, reward_group, tokenizer, judge)
    source = RolloutSource.from_config(cfg, service, dataset, sampler, tokenizer, scorer, run_dir)
    return Batches(service, scorer, source, sampler)
