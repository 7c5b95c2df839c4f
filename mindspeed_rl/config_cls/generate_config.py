"""The ``generate_config`` section: rollout engine and sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .base import opt


@dataclass
class SamplingConfig:
    """Sampling of rollout responses."""

    seed: int = opt(1, "Sampling seed.", ge=0)
    logprobs: int = opt(1, "Log-probs returned per generated token (1: the sampled token).", ge=0)
    max_tokens: int = opt(2048, "Most new tokens per response.", ge=1)
    top_p: float = opt(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = opt(-1, "Top-k sampling (-1: off).", ge=-1)
    min_p: float = opt(0.0, "Minimum probability relative to the most likely token.", ge=0, le=1)
    temperature: float = opt(1.0, "Sampling temperature (0: greedy).", ge=0)
    detokenize: bool = opt(False, "Return response text as well as token ids.")
    ignore_eos: bool = opt(False, "Keep generating after EOS, up to max_tokens (benchmarks: fixed response lengths).")
    min_tokens: int = opt(
        0, "EOS cannot be sampled before this many new tokens (its log-prob stays the unconstrained one).", ge=0
    )


@dataclass
class GenerateConfig:
    """Rollout engine (vLLM or the fallback) inside the integrated actor."""

    backend: str = opt(
        "auto",
        "Rollout engine: vllm, fallback (megatron-core), or auto (vLLM when it "
        "can run the model, else fallback; the log says which and why).",
        choices=("auto", "vllm", "fallback"),
    )
    enforce_eager: bool = opt(True, "No CUDA/NPU graphs; on CPU no compiling (false: ~25 s per engine, faster decode).")
    batch_invariant: bool = opt(
        False,
        "Zero-difference mode (docs/rollout.md): the megatron-core rollout engine and the actor's forwards compute "
        "each token independently of batch and length, so rollout and recomputed log-probs are bitwise equal "
        "(rollout/logprob_exact_share 1). Needs backend fallback, use_remove_padding, actor TP and CP 1, no LoRA.",
    )
    trust_remote_code: bool = opt(False, "Allow model code from the checkpoint folder.")
    offload_train_optimizer: bool = opt(False, "Move optimizer state to host during rollout.")
    offload_train_grad: bool = opt(False, "Move gradients to host during rollout.")
    offload_train_param: bool = opt(False, "Move training weights to host during rollout.")
    infer_tensor_parallel_size: int = opt(
        1, "Tensor-parallel size of the engine (equal, multiple or divisor of the actor's).", ge=1
    )
    infer_pipeline_parallel_size: int = opt(1, "Pipeline-parallel size of the engine.", ge=1, le=1)
    infer_expert_parallel_size: int = opt(1, "Expert-parallel size: infer TP x infer DP ranks share the experts.", ge=1)
    infer_data_parallel_size: int = opt(1, "Engines whose MoE layers run together (with expert parallelism).", ge=1)
    max_num_seqs: int = opt(256, "Most sequences the engine runs at once.", ge=1)
    max_model_len: int = opt(4096, "Longest prompt + response the engine accepts.", ge=1)
    max_num_batched_tokens: int = opt(8192, "Token budget of one engine step.", ge=1)
    dtype: str = opt(
        "auto",
        "Engine weights dtype; auto: the actor's trained precision (bf16 -> bfloat16, fp16 -> float16, else float32).",
        choices=("bfloat16", "float16", "float32", "auto"),
    )
    rollout_quantization: str = opt(
        "none",
        "Run the rollout engines quantized (docs/rollout.md, Low-precision rollout), re-quantized from the trained "
        "weights at every weight sync: int8 = W8A8 INT8 of the decoder layers' projections, weights per output "
        "channel quantized before the transfer, activations per token (vLLM's compressed-tensors kernels; CPU, "
        "NVIDIA Turing and later); fp8 = FP8 weights per output channel and activations per token (vLLM's online "
        "quantization; CPU with vLLM 0.32, NVIDIA Hopper and later). Training stays in bf16 / fp32; "
        "rollout_correction.rollout_is defaults to token-level truncated IS. Needs a vLLM engine, of dtype "
        "bfloat16 or float16 (int8 on CPU: float32 too).",
        choices=("none", "int8", "fp8"),
    )
    gpu_memory_utilization: float = opt(
        0.5, "Fraction of device memory for the engine (CPU: of host memory, as a KV-cache byte budget).", gt=0, le=1
    )
    weight_transfer: str = opt(
        "channel",
        "How new weights reach rollout workers on devices of their own (rl_config.rollout_resource): channel "
        "(ours: a broadcast group of the device's collective library, gloo on CPU; every vLLM release and the "
        "fallback engine) or vllm_native (vLLM's weight-transfer engines, 0.22 and later: nccl on CUDA, hccl "
        "with vllm-ascend, our gloo engine on CPU; off by default until checked on hardware). Where the "
        "installed vLLM has no such API the run keeps the channel and says so.",
        choices=("channel", "vllm_native"),
    )
    eplb_token_collects: bool = opt(
        False,
        "Count the tokens the rollout routes to each expert of each MoE layer (the routes captured as for router "
        "replay), into eplb_token_save_path after every iteration: the input of cli/eplb_generate_map.py.",
    )
    eplb_token_save_path: str = opt("", "Where the expert load goes (default: the run folder's expert_load.json).")
    expert_map_path: Optional[str] = opt(
        None,
        "An expert map (cli/eplb_generate_map.py; vllm-ascend's format) for the rollout engines: replicas of hot "
        "experts placed over the engine's expert-parallel devices. Checked against the model, then refused where "
        "the engine cannot load one (docs/models.md, Expert placement).",
    )
    sampling_config: SamplingConfig = opt(doc="Sampling settings.", factory=SamplingConfig)
