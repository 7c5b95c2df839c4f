"""Benchmark suites during training (eval_config): each suite's problems sampled n times on the rollout engines with
the weights of the iteration just finished, scored by the suite's verifier in the training verifiers' process pool,
and logged as ``eval/<suite>/<metric>`` (pass@k, maj@k, mean@n, response_length/mean, truncated/rate) beside the
iteration's metrics. The same suites, scorers and numbers as cli/evaluate.py on that iteration's checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Tuple

import torch

from ...algorithms.sample_metrics import pass_at_k
from ...config_cls.ppo_config import PPOConfig
from ...evaluation.scoring import SuiteSamples, chosen_ks, evaluate_suite, samples_of, suite_scalars
from ...evaluation.suites import run_suites
from ...features.evaluation import max_new_tokens, sampling_temperature
from ...utils.hf_tokenizer import decode_known


def eval_worker_args(cfg: PPOConfig) -> Dict:
    """What evaluation's own engine is built with (workers/eval_worker.py)."""
    gen = cfg.generate
    return dict(
        ev=cfg.evaluation,
        tokenizer_dir=cfg.actor.megatron.tokenizer_name_or_path,
        max_prompt_length=cfg.rl.max_prompt_length,
        dtype=gen.dtype,
        max_model_len=gen.max_model_len,
        max_new_tokens=max_new_tokens(cfg),
        seed=gen.sampling_config.seed,
        verifier_timeout=cfg.rl.verifier_timeout,
    )


@dataclasses.dataclass
class RolloutSampler:
    """The rollout source's engines as evaluate_suite's sampler: RolloutSource.evaluate with seeds of its own, the
    training pool untouched."""

    source: Any
    n: int
    seed: int
    tokenizer: Any

    def sample(self, prompts, sampling, desc: str) -> SuiteSamples:
        outputs, _ = self.source.evaluate(prompts, self.n, self.seed, sampling)
        return samples_of(outputs, self.n, lambda ids: decode_known(self.tokenizer, ids)[0])


class SuiteEvaluation:
    """When to evaluate and how: the suites, their sampling, their scorers; with engines of its own (``group``,
    eval_config.engines own) the saved checkpoints handed to them and their results collected as they come."""

    def __init__(self, cfg: PPOConfig, tokenizer, group=None):
        from ...rewards.runner import RuleRewardRunner

        ev = cfg.evaluation
        assert ev is not None
        self.ev, self.tokenizer, self.last = ev, tokenizer, cfg.megatron_training.train_iters
        self.group, self.save_dir = group, cfg.actor.megatron.save
        self.pending: List[Tuple[int, list]] = []  # (iteration, result references) handed to the own engines
        self.suites = run_suites(cfg, tokenizer) if group is None else []
        self.ks = chosen_ks(ev.k, ev.n)
        # cli/evaluate.py's sampling: none of training's top_k, min_p, min_tokens or ignore_eos
        self.sampling = dataclasses.replace(
            cfg.generate.sampling_config,
            temperature=sampling_temperature(ev.temperature, ev.n),
            top_p=ev.top_p,
            top_k=-1,
            min_p=0.0,
            min_tokens=0,
            ignore_eos=False,
            max_tokens=max_new_tokens(cfg),
        )
        self.seed = cfg.generate.sampling_config.seed
        workers = max(1, int(cfg.rl.num_cpus_for_local_task))
        self.runners = {
            v: RuleRewardRunner([v], [1.0], cfg.rl.verifier_timeout, workers) for v in {s.verifier for s in self.suites}
        }
        for suite in self.suites:
            print(suite.summary(), flush=True)

    def due(self, iteration: int) -> bool:
        """After every ``interval`` iterations and after the last one."""
        every = self.ev.interval
        return iteration == self.last or (every > 0 and iteration % every == 0)

    def step(self, source, iteration: int, logger, clock) -> Dict[str, float]:
        """The iteration's evaluation: on the rollout engines when due; with engines of their own, the results that
        have come in since, without waiting (``eval/iteration``: the iteration each evaluated; all but the latest
        recorded apart, at this iteration); ``clock`` times the rollout engines' one (timing/evaluation)."""
        if self.group is None:
            if not self.due(iteration):
                return {}
            with clock.measure("timing/evaluation"):
                return self.run(source, iteration)
        done = self.collect(wait=False)
        for metrics in done[:-1]:
            logger.record({"iteration": iteration, **metrics})
        return done[-1] if done else {}

    def finish(self, iteration: int, logger) -> List[Dict[str, float]]:
        """The run's end: the evaluations still running waited for and recorded (at the last iteration)."""
        done = self.collect(wait=True)
        for metrics in done:
            logger.record({"iteration": iteration, **metrics})
        return done

    def saved(self, iteration: int) -> None:
        """A checkpoint was saved: engines of their own evaluate its HF folder when it is due."""
        if self.group is not None and self.due(iteration):
            from ...checkpoint.convert import hf_folder_of

            self.pending.append((iteration, self.group.call_async("evaluate", hf_folder_of(self.save_dir, iteration))))

    def collect(self, wait: bool) -> List[Dict[str, float]]:
        """The finished evaluations of the own engines, in order (all of them with ``wait``)."""
        import ray

        done = []
        while self.pending:
            iteration, refs = self.pending[0]
            if not wait and ray.wait(refs, num_returns=len(refs), timeout=0)[1]:
                break
            self.pending.pop(0)
            metrics = {"eval/iteration": float(iteration), **ray.get(refs)[0]}
            print(f"evaluation of iteration {iteration} (own engine): {console_line(metrics, self.ks)}", flush=True)
            done.append(metrics)
        return done

    def run(self, source, iteration: int) -> Dict[str, float]:
        """Every suite on ``source``'s engines (RolloutSource.evaluate: its own seeds, the training pool untouched),
        said in one line."""
        metrics: Dict[str, float] = {}
        sampler = RolloutSampler(source, self.ev.n, self.seed, self.tokenizer)
        for suite in self.suites:
            numbers, _, _ = evaluate_suite(sampler, suite, self.sampling, self.ks, self.runners[suite.verifier])
            metrics.update(suite_scalars(suite.name, numbers))
        print(f"evaluation at iteration {iteration}: {console_line(metrics, self.ks)}", flush=True)
        return metrics

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()
        self.pending = []


def console_line(metrics: Dict[str, float], ks: List[int]) -> str:
    """Each suite's pass@k and maj@k at the smallest and largest k: "gsm8k pass@1 0.412 pass@8 0.733 maj@8 0.55"."""
    shown = sorted({ks[0], ks[-1]})
    suites = dict.fromkeys(k.split("/")[1] for k in metrics if k.count("/") >= 2)
    return "; ".join(
        f"{name} " + " ".join(f"{m}@{k} {metrics[f'eval/{name}/{m}@{k}']:.3f}" for m in ("pass", "maj") for k in shown)
        for name in suites
    )


def validation_metrics(per_verifier: Dict[str, torch.Tensor], runner, first: str, n: int, exp) -> Dict[str, float]:
    """The held-out set's numbers (rl_config.test_freq) from each verifier's values over prompts x n responses:

    val/<verifier>/mean@N  mean verifier value
    val/score/mean         mean weighted score (the console's "val")
    val/pass@N             share of prompts with at least one response the first verifier scores > 0
    val/pass@k             for k = 1, 2, 4, ... < N: the unbiased estimate from the N responses
    val/response_length/mean
    """
    scores = runner.weighted(per_verifier)
    solved = per_verifier[first].view(-1, n) > 0
    metrics = {f"val/{name}/mean@{n}": float(values.mean()) for name, values in per_verifier.items()}
    ks = [1 << j for j in range(n.bit_length()) if 1 << j < n]
    metrics.update({f"val/pass@{k}": float(pass_at_k(solved, k).mean()) for k in ks})
    metrics["val/score/mean"] = float(scores.mean())
    metrics[f"val/pass@{n}"] = float(solved.any(1).float().mean())
    metrics["val/response_length/mean"] = float(exp.response_mask.sum(1).float().mean())
    return metrics
