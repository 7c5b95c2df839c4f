"""A rank of evaluation's own engines (eval_config.engines own): each checkpoint the run saves at a multiple of
eval_config.interval (its HF folder, save_hf) loaded into a fresh vLLM engine on devices of its own, the suites
sampled and scored as cli/evaluate.py does, while the actor trains on; the engine is released after each one."""

from __future__ import annotations

from typing import Dict, List, Optional

from ..config_cls.eval_config import EvalConfig
from ..protocol import RankLayout, WorldSpec
from .base_worker import start_worker_process


class EvalWorker:
    def __init__(
        self,
        world: WorldSpec,
        ev: EvalConfig,
        tokenizer_dir: str,
        max_prompt_length: int,
        dtype: str,
        max_model_len: int,
        max_new_tokens: int,
        seed: int,
        verifier_timeout: float,
    ):
        from ..evaluation.engine import Sampling
        from ..evaluation.scoring import chosen_ks
        from ..evaluation.suites import load_suites
        from ..features.evaluation import sampling_temperature
        from ..rewards.runner import RuleRewardRunner
        from ..utils.hf_tokenizer import load_tokenizer

        self.acc = start_worker_process(world)
        self.rank, self.world_size = world.rank, world.world_size
        tokenizer = load_tokenizer(tokenizer_dir, "megatron_training.tokenizer_name_or_path")
        self.suites = load_suites(ev.suites, tokenizer, tokenizer_dir, ev.prompt_type, max_prompt_length, ev.limit)
        temperature = sampling_temperature(ev.temperature, ev.n)
        self.sampling = Sampling(ev.n, temperature, ev.top_p, -1, max_new_tokens, seed)
        self.ks: List[int] = chosen_ks(ev.k, ev.n)
        self.dtype, self.max_model_len = dtype, max_model_len
        verifiers = {s.verifier for s in self.suites}
        self.runners = {v: RuleRewardRunner([v], [1.0], verifier_timeout) for v in verifiers} if self.rank == 0 else {}

    def layout(self) -> RankLayout:
        return RankLayout.of_engine_rank(self.rank, self.world_size, self.world_size)

    def evaluate(self, hf_dir: str) -> Optional[Dict[str, float]]:
        """Every suite on the weights of ``hf_dir``: ``eval/<suite>/<metric>`` (on the first rank; None on the
        others)."""
        from ..evaluation.engine import VllmSampler
        from ..evaluation.scoring import evaluate_suite, suite_scalars
        from ..rollout.engines.vllm_engine import stop_llm

        sampler = VllmSampler(hf_dir, self.dtype, self.max_model_len, self.world_size, self.sampling.seed)
        metrics: Dict[str, float] = {}
        try:
            for suite in self.suites:
                if self.rank == 0:
                    numbers, _, _ = evaluate_suite(sampler, suite, self.sampling, self.ks, self.runners[suite.verifier])
                    metrics.update(suite_scalars(suite.name, numbers))
                else:
                    sampler.sample(suite.prompts, self.sampling, suite.name)  # every rank of the engine steps
        finally:
            stop_llm(sampler.llm)
        return metrics if self.rank == 0 else None

    def shutdown(self) -> None:
        from ..utils import dist

        for runner in self.runners.values():
            runner.close()
        dist.destroy()
