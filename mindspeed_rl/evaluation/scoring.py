"""A suite's samples scored by the training verifiers (the same rule reward runner, so a number means the same in
training and evaluation), and its metrics: pass@k, maj@k, the mean score, response length and truncation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from ..algorithms.sample_metrics import maj_at_k, pass_at_k
from ..rewards.registry import answer_reader
from ..rewards.verifiers import answer_key


@dataclass
class SuiteSamples:
    """A suite's n samples per problem, rows problems and columns samples in the order drawn."""

    texts: List[List[str]]
    lengths: torch.Tensor  # long [problems, n]: response tokens
    truncated: torch.Tensor  # bool [problems, n]: stopped by the token budget, not by EOS

    @property
    def n(self) -> int:
        return self.lengths.shape[1]


def default_ks(n: int) -> List[int]:
    """k = 1, 2, 4, ... up to n, and n itself."""
    ks = [1 << j for j in range(n.bit_length()) if 1 << j <= n]
    return ks if ks[-1] == n else ks + [n]


def chosen_ks(k: Sequence[int], n: int) -> List[int]:
    """The k of pass@k and maj@k: those given (sorted, once each), else ``default_ks(n)``."""
    return sorted(set(k)) if k else default_ks(n)


def suite_scalars(suite: str, numbers: Dict[str, float]) -> Dict[str, float]:
    """A suite's numbers as a run logs them: ``eval/<suite>/<metric>`` (its problem count left out)."""
    return {f"eval/{suite}/{k}": v for k, v in numbers.items() if k != "problems"}


def vote_ids(answers: Sequence[Sequence[Optional[str]]]) -> torch.Tensor:
    """Per problem, equal ids for equal answers (answer_key), -1 for none: maj@k's ballots."""
    out = []
    for row in answers:
        seen: Dict[str, int] = {}
        out.append([-1 if a is None else seen.setdefault(a, len(seen)) for a in row])
    return torch.tensor(out, dtype=torch.long)


def suite_metrics(
    scores: torch.Tensor, samples: SuiteSamples, verifier: str, ks: Sequence[int], correct_at: float = 1.0
) -> Dict[str, float]:
    """The suite's numbers from each sample's score [problems, n]:

    pass@k  = mean over problems of 1 - C(n - c, k) / C(n, k)   (c: samples scoring >= correct_at)
    maj@k   = mean over problems of [the most frequent final answer of the first k samples is correct]
    mean@n  = mean score of all samples
    """
    n = samples.n
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"k {bad[0]}: needs 1 <= k <= n ({n} samples per problem)")
    correct = scores >= correct_at - 1e-9
    read = answer_reader(verifier)
    votes = vote_ids([[answer_key(read(t)) for t in row] for row in samples.texts])
    out: Dict[str, float] = {}
    for k in ks:
        out[f"pass@{k}"] = float(pass_at_k(correct, k).mean())
    for k in ks:
        out[f"maj@{k}"] = float(maj_at_k(votes, correct, k).float().mean())
    out[f"mean@{n}"] = float(scores.mean())
    out["response_length/mean"] = float(samples.lengths.float().mean())
    out["truncated/rate"] = float(samples.truncated.float().mean())
    out["problems"] = float(scores.shape[0])
    return out


def score_samples(runner, samples: SuiteSamples, labels: Sequence[str]) -> torch.Tensor:
    """Each sample's score [problems, n] by ``runner`` (a RuleRewardRunner of the suite's verifier)."""
    flat = [t for row in samples.texts for t in row]
    flat_labels = [lab for lab in labels for _ in range(samples.n)]
    per_verifier, _ = runner.score_each(flat, flat_labels)
    return runner.weighted(per_verifier).view(len(labels), samples.n)


def samples_of(outputs, n: int, decode) -> SuiteSamples:
    """SuiteSamples of rollout outputs numbered by prompt (n each, in order); ``decode``: ids -> text."""
    rows = [outputs[i : i + n] for i in range(0, len(outputs), n)]
    return SuiteSamples(
        texts=[[decode(o.response_ids) for o in row] for row in rows],
        lengths=torch.tensor([[len(o.response_ids) for o in row] for row in rows], dtype=torch.long),
        truncated=torch.tensor([[o.finish_reason == "length" for o in row] for row in rows], dtype=torch.bool),
    )


def evaluate_suite(sampler, suite, sampling, ks: Sequence[int], runner):
    """One suite sampled by ``sampler`` (evaluation/engine.py) and scored by ``runner``: (metrics, samples,
    scores)."""
    samples = sampler.sample(suite.prompts, sampling, suite.name)
    scores = score_samples(runner, samples, suite.prompts.labels)
    return suite_metrics(scores, samples, suite.verifier, ks, suite.correct_at), samples, scores
