"""The ``judge_config`` section: a generative judge that grades each response (rewards/judge.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, List, Optional

from .base import ConfigError, opt

ENGINE_KEYS = (
    "load", "tokenizer_name_or_path", "infer_tensor_parallel_size", "dtype", "max_model_len", "max_num_seqs",
    "max_num_batched_tokens", "gpu_memory_utilization", "enforce_eager",
)  # fmt: skip
HTTP_KEYS = (
    "base_url", "model_name", "concurrency", "timeout", "retries", "deadline", "api_key_env", "max_response_bytes",
)  # fmt: skip


@dataclass
class JudgeConfig:
    """A model asked to grade each response through ``template``; the score is parsed from its answer
    (docs/rewards.md, "Generative judge")."""

    serve: str = opt(
        "engines",
        "engines: vLLM engines of the judge's own on rl_config.judge_resource (weights from `load`, never "
        "synchronised); http: an OpenAI-compatible endpoint (`base_url`).",
        choices=("engines", "http"),
    )
    weight: float = opt(1.0, "Weight of the judge's score (in [0, 1]) in a response's score, beside the verifiers'.")
    template: Optional[str] = opt(
        None,
        "The judge's prompt with {prompt}, {response} and {label} filled in (other braces stay as they are); "
        "None: the built-in template (a 0-10 grade ending in 'Score: <n>').",
    )
    template_file: Optional[str] = opt(None, "A text file holding the template (instead of `template`).")
    score_pattern: Optional[str] = opt(
        None,
        "A regular expression whose first group is the score, matched case-insensitively; the last match in the "
        "answer counts. None: 'Score: <n>' (or \\boxed{<n>}).",
    )
    score_min: float = opt(0.0, "The lowest score the template asks for (maps to 0).")
    score_max: float = opt(10.0, "The highest score the template asks for (maps to 1).")
    on_failure: float = opt(
        0.0,
        "Score of a response whose verdict failed (request failed after its retries, or no score in the answer); "
        "counted in judge/request_failures and judge/parse_failures.",
    )
    max_tokens: int = opt(512, "Most tokens of the judge's answer.", ge=1)
    temperature: float = opt(0.0, "The judge's sampling temperature (0: greedy).", ge=0)
    overlap: bool = opt(
        True,
        "Judge the groups that finished while the rest of the batch still generates (multi-round rollouts: "
        "tools, partial rollout); judge/overlap_share says how much of the judge's time was hidden.",
    )
    # serve: engines
    load: Optional[str] = opt(
        None, "engines: the judge's weights, a HF folder or an mcore checkpoint folder (converted at start)."
    )
    tokenizer_name_or_path: Optional[str] = opt(
        None, "engines, an mcore `load`: the judge's tokenizer folder (None: megatron_training's, the policy's)."
    )
    infer_tensor_parallel_size: int = opt(1, "engines: tensor-parallel size of each judge engine.", ge=1)
    dtype: str = opt("bfloat16", "engines: weights dtype.", choices=("bfloat16", "float16", "float32", "auto"))
    max_model_len: int = opt(4096, "engines: longest judge prompt + answer.", ge=1)
    max_num_seqs: int = opt(256, "engines: most sequences an engine runs at once.", ge=1)
    max_num_batched_tokens: int = opt(8192, "engines: token budget of one engine step.", ge=1)
    gpu_memory_utilization: float = opt(
        0.8, "engines: device memory share of the engine (CPU: share of host memory for its KV cache).", gt=0, le=1
    )
    enforce_eager: bool = opt(True, "engines: no CUDA/NPU graphs (CPU: no compiling).")
    # serve: http
    base_url: Optional[str] = opt(None, "http: the endpoint, e.g. http://10.0.0.5:8000/v1.")
    model_name: Optional[str] = opt(None, "http: the model name the endpoint serves.")
    api: str = opt(
        "chat",
        "chat: the template's text is the user's message under the judge's chat template (http: "
        "/chat/completions); completions: the text as it is (http: /completions).",
        choices=("chat", "completions"),
    )
    concurrency: int = opt(8, "http: most requests in flight.", ge=1)
    timeout: float = opt(60.0, "http: wall-clock seconds a request may take before it is retried or fails.", gt=0)
    retries: int = opt(2, "http: further tries of a failed request.", ge=0)
    deadline: Optional[float] = opt(
        900.0,
        "http: seconds one scoring call's requests may take in all; those unfinished then fail (counted). A hung "
        "server otherwise costs timeout x (retries + 1) per wave of `concurrency` requests. null: no deadline.",
        gt=0,
    )
    api_key_env: str = opt(
        "OPENAI_API_KEY", "http: environment variable holding the API key (a local server takes any)."
    )
    max_response_bytes: Optional[int] = opt(
        None,
        "http: most bytes of one answer, counted after gzip / deflate decoding as they stream (a longer one fails, "
        "counted in judge/request_failures). "
        "None: 16 bytes per max_tokens + 64 KiB.",
        ge=1024,
    )

    def __post_init__(self) -> None:
        self.unused: List[str] = []  # keys given for the other way of serving (check)

    def check(self, path: str = "judge_config", given: AbstractSet[str] = frozenset()) -> None:
        """The keys together (build_section calls it); ``given``: the keys the YAML sets. Keys of the other serving
        way are not used, and said so in the batch plan (``unused``): switching the way of serving is one key."""
        other = HTTP_KEYS if self.serve == "engines" else ENGINE_KEYS
        self.unused = [f"{path}.{key}" for key in sorted(set(given) & set(other))]
        if self.score_pattern is not None:
            import re

            try:
                groups = re.compile(self.score_pattern).groups
            except re.error as exc:
                raise ConfigError(
                    "judge_config.score_pattern", f"{self.score_pattern!r} is not a regex: {exc}"
                ) from None
            if groups < 1:
                raise ConfigError("judge_config.score_pattern", "needs a group around the score, e.g. 'score (\\d+)'")
        if self.score_max <= self.score_min:
            raise ConfigError("judge_config.score_max", f"{self.score_max} is not above score_min {self.score_min}")
        if self.template is not None and self.template_file is not None:
            raise ConfigError("judge_config.template_file", "give the template or a template_file, not both")
        if self.serve == "engines" and not self.load:
            raise ConfigError("judge_config.load", "required with serve engines: the judge's HF or mcore folder")
        if self.serve == "http":
            for key in ("base_url", "model_name"):
                if not getattr(self, key):
                    raise ConfigError(f"judge_config.{key}", "required with serve http")
            if not str(self.base_url).startswith(("http://", "https://")):
                raise ConfigError("judge_config.base_url", f"{self.base_url!r} is not an http(s) URL")
