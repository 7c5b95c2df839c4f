"""A rank of the generative judge's own engines (judge_config.serve engines): vLLM over the judge's HF folder, on
devices of its own (rl_config.judge_resource). Engines are blocks of ``infer_tensor_parallel_size`` contiguous
ranks; the weights are loaded once and never synchronised with the policy."""

from __future__ import annotations

from typing import List, Optional, Sequence

from ..config_cls.generate_config import GenerateConfig
from ..config_cls.judge_config import JudgeConfig
from ..protocol import RankLayout, WorldSpec
from .base_worker import start_worker_process


def judge_engine_settings(judge: JudgeConfig) -> GenerateConfig:
    """The judge's engine keys as the GenerateConfig the engine builder reads."""
    return GenerateConfig(
        enforce_eager=judge.enforce_eager,
        infer_tensor_parallel_size=judge.infer_tensor_parallel_size,
        max_num_seqs=judge.max_num_seqs,
        max_model_len=judge.max_model_len,
        max_num_batched_tokens=judge.max_num_batched_tokens,
        dtype=judge.dtype,
        gpu_memory_utilization=judge.gpu_memory_utilization,
    )


class JudgeWorker:
    def __init__(self, world: WorldSpec, judge: JudgeConfig, hf_dir: str):
        from ..rollout.engines.vllm_engine import text_llm

        self.acc = start_worker_process(world)
        self.rank, self.world_size = world.rank, world.world_size
        self.engine_size = judge.infer_tensor_parallel_size
        self.engine_rank = world.rank % self.engine_size
        self.llm = text_llm(hf_dir, judge_engine_settings(judge))
        self.max_model_len, self.chat = judge.max_model_len, judge.api == "chat"
        self.tokenizer = self.llm.get_tokenizer()  # api chat: its chat template was checked before start

    def layout(self) -> RankLayout:
        return RankLayout.of_engine_rank(self.rank, self.world_size, self.engine_size)

    def answer(self, texts: Sequence[str], max_tokens: int, temperature: float) -> Optional[List[Optional[str]]]:
        """The judge's reply to each text (the engine's first rank returns them; None on the others). With api chat
        the text is the user's message under the model's chat template. A prompt that leaves no room for an
        answer within max_model_len gets None (a failed request, counted), never an error for the whole batch."""
        from vllm import SamplingParams

        if self.chat:
            prompts = [
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": t}], tokenize=True, add_generation_prompt=True
                )
                for t in texts
            ]
        else:
            prompts = [self.tokenizer.encode(t) for t in texts]
        fits = [i for i, ids in enumerate(prompts) if len(ids) < self.max_model_len]
        params = [
            SamplingParams(
                temperature=temperature, max_tokens=min(max_tokens, self.max_model_len - len(prompts[i])), seed=0
            )
            for i in fits
        ]
        requests = [{"prompt_token_ids": list(prompts[i])} for i in fits]
        results = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        replies: List[Optional[str]] = [None] * len(texts)
        for i, result in zip(fits, results):
            replies[i] = result.outputs[0].text
        return replies if self.engine_rank == 0 else None

    def shutdown(self) -> None:
        from ..rollout.engines.vllm_engine import release_at_exit
        from ..utils import dist

        release_at_exit()  # the run's end: the process is killed next, the engine with it
        dist.destroy()
