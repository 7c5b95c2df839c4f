"""The model an evaluation samples: a HF folder as it is, or a training checkpoint (Megatron) written as a HF folder
first; sampled by vLLM, or by the megatron-core engine where vLLM cannot run the model on this device (the same
choice as generate_config.backend auto)."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import List, Optional

import torch

from ..checkpoint.megatron_layout import TRACKER
from ..datasets.prompt_dataset import PromptBatch
from .scoring import SuiteSamples, samples_of


class ModelError(ValueError):
    """A model path that cannot be evaluated (the message names it and why)."""


@dataclass
class Sampling:
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 512
    seed: int = 1

    def problem_seeds(self, suite: str, problems: int) -> List[int]:
        """Problem i's first seed: its n samples are seeded ``first + j`` (vLLM seeds a request's n children so),
        and each problem takes n seeds of a stream named after the suite, so no two samples of an evaluation share
        a seed (``seed + i`` gave problem i's sample j+1 the seed of problem i+1's sample j)."""
        from ..rollout.source.production import SeedStream

        seeds = SeedStream(self.seed, f"evaluation/{suite}")
        return [seeds.take(self.n) for _ in range(problems)]


def is_hf_folder(model: str, tokenizer: Optional[str]) -> bool:
    """True for a HF folder, False for a training checkpoint with the run's tokenizer; ModelError for anything else
    (checked before the tokenizer is read or anything heavy starts)."""
    if os.path.isfile(os.path.join(model, "config.json")):
        if tokenizer:
            raise ModelError(f"--tokenizer {tokenizer}: a HF folder ({model}) brings its own tokenizer")
        return True
    if not os.path.isfile(os.path.join(model, TRACKER)):
        raise ModelError(f"--model {model}: neither a HF folder (config.json) nor a training checkpoint ({TRACKER})")
    if not tokenizer or not os.path.isfile(os.path.join(tokenizer, "tokenizer_config.json")):
        raise ModelError(f"--tokenizer {tokenizer}: a training checkpoint needs the run's HF tokenizer folder")
    return False


def _checkpoint_config(model: str) -> dict:
    """A training checkpoint's recorded config; ModelError naming it when it cannot be read or cannot generate."""
    from ..checkpoint.megatron_layout import CheckpointError
    from ..checkpoint.megatron_reader import read_mg_config

    try:
        config = read_mg_config(model)[0]
    except (CheckpointError, OSError, KeyError) as exc:
        raise ModelError(f"--model {model}: {exc}") from None
    if config.get("orm"):
        raise ModelError(f"--model {model}: a reward/critic checkpoint (value head) cannot generate text")
    return config


def model_context(model: str, tokenizer: Optional[str]) -> int:
    """The longest sequence (prompt and response) the model takes: its max_position_embeddings (a vision-language
    model's language half), 4096 when it names none."""
    if is_hf_folder(model, tokenizer):
        with open(os.path.join(model, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
        longest = config.get("max_position_embeddings") or (config.get("text_config") or {}).get(
            "max_position_embeddings"
        )
    else:
        longest = _checkpoint_config(model).get("model", {}).get("max_position_embeddings")
    return int(longest or 4096)


def hf_folder(model: str, tokenizer: Optional[str], workdir: str) -> str:
    """A HF folder of ``model``: itself, or the latest iteration of a training checkpoint written into ``workdir``
    with ``tokenizer``'s files (the checkpoint's own dtype)."""
    if is_hf_folder(model, tokenizer):
        return model
    from ..checkpoint.convert import export_latest
    from ..checkpoint.errors import ConversionError
    from ..checkpoint.megatron_layout import CheckpointError

    _checkpoint_config(model)
    try:
        return export_latest(model, os.path.join(workdir, "hf"), tokenizer)
    except (CheckpointError, ConversionError, OSError, KeyError) as exc:
        raise ModelError(f"--model {model}: {exc}") from None


def engine_dtype(choice: str) -> str:
    """--dtype auto: bfloat16 where the device runs it natively, else float32 (the training precision rule)."""
    if choice != "auto":
        return choice
    from ..accelerator import get_accelerator

    try:
        return "bfloat16" if get_accelerator().host_precision().native_bf16 else "float32"
    except NotImplementedError:
        return "bfloat16"


class VllmSampler:
    """vLLM over the HF folder; n samples per prompt from one seeded request each (Sampling.problem_seeds)."""

    name = "vllm"

    def __init__(self, hf_dir: str, dtype: str, max_model_len: int, tensor_parallel_size: int, seed: int):
        from ..config_cls.generate_config import GenerateConfig
        from ..rollout.engines.vllm_engine import text_llm

        gen = GenerateConfig(
            dtype=dtype,
            max_model_len=max_model_len,
            infer_tensor_parallel_size=tensor_parallel_size,
            enforce_eager=True,
        )
        self.llm = text_llm(hf_dir, gen, seed)
        self.max_model_len = max_model_len
        config = self.llm.llm_engine.model_config.hf_config
        self.image_token_id = getattr(config, "image_token_id", None)

    def sample(self, prompts: PromptBatch, sampling: Sampling, desc: str) -> SuiteSamples:
        from vllm import SamplingParams

        from ..rollout.engines.multimodal import vllm_prompt

        requests, params = [], []
        seeds = sampling.problem_seeds(desc, len(prompts.input_ids))
        for i, ids in enumerate(prompts.input_ids):
            images = prompts.images[i] if prompts.images else b""
            requests.append(vllm_prompt(ids, images, self.image_token_id))
            room = self.max_model_len - len(ids)
            if room < 1:
                raise ModelError(f"{desc}: problem {i + 1} has {len(ids)} prompt tokens, --max-model-len is lower")
            params.append(
                SamplingParams(
                    n=sampling.n,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k if sampling.top_k > 0 else -1,
                    max_tokens=min(sampling.max_new_tokens, room),
                    seed=seeds[i],
                )
            )
        results = self.llm.generate(requests, params, use_tqdm=functools.partial(_bar, desc))
        outs = [sorted(r.outputs, key=lambda o: o.index) for r in results]
        return SuiteSamples(
            texts=[[o.text for o in row] for row in outs],
            lengths=torch.tensor([[len(o.token_ids) for o in row] for row in outs], dtype=torch.long),
            truncated=torch.tensor([[o.finish_reason == "length" for o in row] for row in outs], dtype=torch.bool),
        )


def _bar(suite: str, *args, **kwargs):
    """vLLM's progress bars (adding requests, processing them) named after the suite."""
    from tqdm import tqdm

    kwargs["desc"] = f"{suite}: {kwargs.get('desc') or 'sample'}"
    return tqdm(*args, **kwargs)


class MegatronSampler:
    """The megatron-core engine (one device) where vLLM cannot run the model here; text prompts only."""

    name = "megatron-core"

    def __init__(self, hf_dir: str, tokenizer, seed: int):
        from ..models.loading import load_generation_model
        from ..utils import dist

        dist.init_distributed()
        dist.init_model_parallel(seed=seed)
        self.model, _ = load_generation_model(hf_dir)
        self.tokenizer = tokenizer

    def sample(self, prompts: PromptBatch, sampling: Sampling, desc: str) -> SuiteSamples:
        from tqdm import tqdm

        from ..rollout.engines.fallback import generate
        from ..utils.hf_tokenizer import decode_known

        if prompts.images:
            raise ModelError(f"{desc}: the megatron-core engine samples text prompts only (vLLM runs vision models)")
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        rows: List[list] = []
        seeds = sampling.problem_seeds(desc, len(prompts.input_ids))
        for i, ids in enumerate(tqdm(prompts.input_ids, desc=f"sample {desc}", unit="problem")):
            rows.append(
                generate(
                    self.model,
                    [ids] * sampling.n,
                    sampling.max_new_tokens,
                    tok.eos_token_id,
                    pad,
                    sampling.temperature,
                    sampling.top_k,
                    sampling.top_p,
                    seed=seeds[i],
                )
            )
        return samples_of([o for row in rows for o in row], sampling.n, lambda ids: decode_known(tok, ids)[0])


def vllm_unusable(hf_dir: str, dtype: str) -> Optional[str]:
    """Why vLLM cannot run this HF folder's model on this device (None when it can)."""
    from ..accelerator import get_accelerator
    from ..checkpoint.hf_io import read_hf_model_config
    from ..config_cls.generate_config import GenerateConfig
    from ..rollout.engines.vllm_engine import vllm_unusable_reason

    try:
        model = read_hf_model_config(hf_dir)
    except Exception:  # noqa: BLE001 - an architecture our families do not hold: vLLM reads it as it is
        return None
    return vllm_unusable_reason(model, GenerateConfig(dtype=dtype), get_accelerator().kind)
