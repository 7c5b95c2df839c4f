"""The generative judge of a PPO run (judge_config): its weights ready for vLLM, its worker group, and the judge
the scorer asks (rewards/judge.py: the template, parsing and failure handling)."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import numpy as np

from ...config_cls.ppo_config import PPOConfig
from ...rewards.judge import EngineJudge, HttpJudge, Judge, load_template
from ...utils.cli import UserError


def judge_hf_folder(cfg: PPOConfig, run_dir: str) -> str:
    """The judge's weights as vLLM reads them: judge_config.load when it is a HF folder, else (an mcore checkpoint
    folder) its latest iteration converted into <run dir>/judge_hf with the run's tokenizer."""
    from ...checkpoint import megatron_layout as ml
    from ...checkpoint.convert import export_latest

    assert cfg.judge is not None and cfg.judge.load
    load = cfg.judge.load
    if ml.read_tracker_or_none(load) is None:
        out = load
    else:
        out = os.path.join(run_dir, "judge_hf")
        print(f"judge: converting the mcore checkpoint {load} for vLLM -> {out}", flush=True)
        tokenizer = getattr(cfg.judge, "tokenizer_name_or_path", None) or cfg.actor.megatron.tokenizer_name_or_path
        out = export_latest(load, out, tokenizer, progress=False)
    if getattr(cfg.judge, "api", "completions") == "chat":
        check_chat_template(out)
    return out


def check_chat_template(hf_dir: str) -> None:
    """api chat needs the judge's tokenizer to have a chat template (refused before the engines start)."""
    from transformers import AutoTokenizer

    if not getattr(AutoTokenizer.from_pretrained(hf_dir), "chat_template", None):
        raise UserError(
            f"judge_config.api: chat, but the judge's tokenizer ({hf_dir}) has no chat template: use api "
            "completions (the template's text as it is)"
        )


def engine_answers(group):
    """The judge worker group as EngineJudge's ``generate``: texts split into contiguous parts, one per engine."""
    import ray

    def generate(texts: Sequence[str], max_tokens: int, temperature: float) -> List[Optional[str]]:
        engines = group.engines()
        parts = np.array_split(np.arange(len(texts)), len(engines))
        args: List[Optional[tuple]] = [None] * len(group.handles)
        for engine, ranks in enumerate(engines):
            for rank in ranks:
                args[rank] = ([texts[i] for i in parts[engine]], max_tokens, temperature)
        results = ray.get(group.call_async("answer", per_rank=args))
        return [reply for ranks in engines for reply in results[ranks[0]]]

    return generate


def make_judge(cfg: PPOConfig, group=None) -> Judge:
    """The run's judge: its own engines (``group``, the JudgeWorker ranks) or the HTTP endpoint."""
    j = cfg.judge
    assert j is not None
    common = dict(
        template=load_template(j.template, j.template_file),
        score_min=j.score_min,
        score_max=j.score_max,
        on_failure=j.on_failure,
        max_tokens=j.max_tokens,
        temperature=j.temperature,
        score_pattern=j.score_pattern,
    )
    if j.serve == "http":
        try:
            import openai  # noqa: F401
        except ImportError:
            raise UserError("judge_config.serve http needs the openai package: pip install openai") from None
        return HttpJudge(
            j.base_url,
            j.model_name,
            concurrency=j.concurrency,
            timeout=j.timeout,
            retries=j.retries,
            api_key_env=j.api_key_env,
            api=j.api,
            deadline=j.deadline,
            max_response_bytes=j.max_response_bytes,
            **common,
        )
    return EngineJudge(engine_answers(group), **common)
