"""Megatron training section.

``megatron_training`` holds the defaults shared by every role; ``actor_config`` and
``critic_config`` hold the same keys and override them per role (MindSpeed-RL's scheme).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

from .base import opt

# the single-role stages a PPO config must not name: where they run
STAGE_ENTRY_POINTS = {
    "rm": "reward-model training: run cli/train_rm.py",
    "sft": "supervised fine-tuning: run cli/train_sft.py",
    "dpo": "preference optimisation: run cli/train_dpo.py",
}


@dataclass
class MegatronConfig:
    """Megatron-core training settings of one role (after merging the role's overrides)."""

    # model and tokenizer
    model: str = opt(
        doc="Name of the model section to use (a key under `model:`, or a file configs/model/<name>.yaml)."
    )
    tokenizer_type: str = opt(
        "PretrainedFromHF", "Tokenizer kind.", choices=("PretrainedFromHF", "HuggingFaceTokenizer")
    )
    tokenizer_name_or_path: Optional[str] = opt(None, "Folder holding the HF tokenizer files.")
    use_mcore_models: bool = opt(True, "Use megatron-core models (always true here).")
    # numerics and kernels: accepted everywhere, mapped to what the device has
    bf16: Union[bool, str] = opt(
        False,
        "Train in bfloat16 (params fp32 in the optimizer); auto: bf16 where the device runs it natively (NPU, CUDA "
        "with bf16, a CPU with AVX512-BF16 or AMX), else fp32 (the batch plan says which and why).",
        choices=(False, True, "auto"),
    )
    fp16: bool = opt(False, "Train in float16 with loss scaling.")
    use_fused_rmsnorm: bool = opt(False, "Fused RMSNorm (NPU: MindSpeed; CUDA: TE, liger-kernel; CPU: torch.compile)")
    use_fused_swiglu: bool = opt(False, "Fused SwiGLU (NPU: MindSpeed; CUDA: liger-kernel; CPU: torch.compile).")
    use_fused_rotary_pos_emb: bool = opt(
        False, "Fused RoPE (NPU: MindSpeed; CUDA: TE, else liger-kernel; CPU: torch.compile)."
    )
    use_flash_attn: bool = opt(False, "Flash attention where the device has it.")
    no_masked_softmax_fusion: bool = opt(False, "Disable the fused masked softmax.")
    attention_softmax_in_fp32: bool = opt(True, "Attention softmax in fp32.")
    no_gradient_accumulation_fusion: bool = opt(False, "Disable the fused wgrad accumulation (CPU: always off).")
    sequence_parallel: bool = opt(False, "Megatron sequence parallelism (needs TP > 1).")
    use_distributed_optimizer: bool = opt(False, "Shard optimizer state across data-parallel ranks.")
    recompute_granularity: Optional[str] = opt(None, "Activation recomputation.", choices=("full", "selective"))
    recompute_method: Optional[str] = opt(
        None, "Which layers to recompute (full granularity).", choices=("uniform", "block")
    )
    recompute_num_layers: Optional[int] = opt(None, "Layers per recompute chunk.", ge=1)
    recompute_modules: Optional[List[str]] = opt(
        None,
        "What selective recomputation recomputes (megatron-core's names): core_attn (the default), layernorm, "
        "mlp, moe.",
    )
    # MindSpeed's memory and speed switches (docs/features.md): on NPU passed to MindSpeed as its flags; on CPU
    # and CUDA recompute_norm is megatron-core's layernorm recomputation and the others are refused
    recompute_norm: bool = opt(False, "Recompute the norms in the backward instead of keeping their outputs.")
    recompute_norm_num_layers: Optional[int] = opt(None, "MindSpeed: recompute the norms of this many layers.", ge=1)
    recompute_activation_function: bool = opt(False, "MindSpeed: recompute the MLP activation (NPU).")
    recompute_activation_function_num_layers: Optional[int] = opt(
        None, "MindSpeed: recompute the activation of this many layers (NPU).", ge=1
    )
    swap_optimizer: bool = opt(False, "MindSpeed: keep the distributed optimizer's fp32 state on host (NPU).")
    reuse_fp32_param: bool = opt(False, "MindSpeed: bf16 weights share memory with their fp32 copies (NPU).")
    swap_attention: bool = opt(False, "MindSpeed: swap attention activations to host (NPU).")
    moe_hierarchical_alltoallv: bool = opt(False, "MindSpeed: two-level all-to-all for MoE dispatch (NPU).")
    attention_dropout: float = opt(0.0, "Attention dropout.", ge=0, lt=1)
    hidden_dropout: float = opt(0.0, "Hidden dropout.", ge=0, lt=1)
    init_method_std: float = opt(0.02, "Std of the normal init of fresh weights.", gt=0)
    distributed_backend: str = opt(
        "nccl",
        "torch.distributed backend; mapped to the device's own (hccl on NPU, nccl on CUDA, gloo on CPU).",
        choices=("nccl", "hccl", "gloo"),
    )
    # parallelism
    tensor_model_parallel_size: int = opt(1, "Tensor-parallel size.", ge=1)
    pipeline_model_parallel_size: int = opt(1, "Pipeline-parallel size.", ge=1)
    expert_model_parallel_size: int = opt(
        1, "Expert-parallel size (MoE): the experts are split over this many data-parallel ranks.", ge=1
    )
    context_parallel_size: int = opt(
        1,
        "Context-parallel size: every sequence is split over this many ranks (long responses); data "
        "parallelism is what remains of the devices after TP x PP x CP.",
        ge=1,
    )
    context_parallel_algo: str = opt(
        "ulysses_cp_algo",
        "How attention spans the split sequence: ulysses_cp_algo (all-to-all between sequence and heads; every "
        "device; the query groups per TP rank must split over CP or divide it) or megatron_cp_algo (ring "
        "attention: Transformer Engine on CUDA, MindSpeed on NPU).",
        choices=("ulysses_cp_algo", "megatron_cp_algo"),
    )
    log_prob_chunk_size: int = opt(
        1024,
        "Tokens whose logits exist at once when the LM head computes log-probs and entropy (recomputed chunk "
        "by chunk in the backward); 0 computes the whole micro-batch at once.",
        ge=0,
    )
    num_layer_list: Optional[str] = opt(None, "Uneven layers per pipeline stage, e.g. '3,5'.")
    virtual_pipeline_model_parallel_size: Optional[int] = opt(
        None,
        "Interleaved pipeline (VPP): model chunks per pipeline rank; rank r holds virtual stages r, r + PP, ... "
        "of PP x VPP equal stages, and megatron-core's interleaved 1F1B schedule runs them (a smaller bubble).",
        ge=1,
    )
    num_layers_per_virtual_pipeline_stage: Optional[int] = opt(
        None, "The same as a layer count per virtual stage (VPP = num_layers / (PP x this)).", ge=1
    )
    # batches and schedule
    global_batch_size: int = opt(1, "Prompts per PPO iteration.", ge=1)
    micro_batch_size: int = opt(1, "Samples per forward/backward micro-batch per data-parallel rank.", ge=1)
    seq_length: int = opt(2048, "Longest training sequence (prompt + response).", ge=1)
    train_iters: int = opt(1, "PPO iterations to run.", ge=1)
    save_interval: int = opt(100, "Save actor and critic every this many iterations.", ge=1)
    stage: str = opt(
        "ray_ppo",
        "MindSpeed-RL's trainer name, kept for its configs: one trainer runs every "
        "algorithm, chosen by rl_config (adv_estimator, policy_loss, ...); rm: reward-model training "
        "(cli/train_rm.py); sft: supervised fine-tuning (cli/train_sft.py); dpo: preference optimisation "
        "(cli/train_dpo.py).",
        choices=("ray_ppo", "ray_grpo", "ray_dapo", "rm", "sft", "dpo"),
    )
    seed: int = opt(1234, "Seed of weights init, data order and sampling.", ge=0)
    # optimizer
    lr: float = opt(1e-6, "Peak learning rate (above 1 Adam diverges: refused).", gt=0, le=1)
    min_lr: float = opt(0.0, "Floor of the decaying learning rate.", ge=0)
    lr_decay_style: str = opt("constant", "Learning-rate schedule.", choices=("constant", "cosine", "linear"))
    lr_decay_iters: Optional[int] = opt(None, "Iterations of decay (default train_iters).", ge=1)
    lr_warmup_fraction: float = opt(0.0, "Fraction of the decay iterations spent in linear warm-up.", ge=0, le=1)
    weight_decay: float = opt(0.01, "AdamW weight decay.", ge=0)
    clip_grad: float = opt(1.0, "Global gradient-norm clip (0 disables).", ge=0)
    adam_beta1: float = opt(0.9, "Adam beta1.", ge=0, lt=1)
    adam_beta2: float = opt(0.999, "Adam beta2.", ge=0, lt=1)
    adam_eps: float = opt(1e-8, "Adam epsilon.", gt=0)
    # LoRA (MindSpeed-LLM's keys)
    lora_r: int = opt(
        0,
        "LoRA rank; 0 trains every parameter, > 0 only adapters on lora_target_modules. At most min(in, out) "
        "of every target layer's full weight (MoE experts: their own size).",
        ge=0,
    )
    lora_alpha: float = opt(
        16.0, "LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_r.", gt=0
    )
    lora_dropout: float = opt(0.0, "Dropout on the adapters' input.", ge=0, lt=1)
    lora_target_modules: List[str] = opt(
        doc="Layers that get adapters: linear_qkv, linear_proj (attention), linear_fc1, linear_fc2 (MLP).",
        factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
    )
    lora_base_load: Optional[str] = opt(
        None,
        "With LoRA: the folder of the base checkpoint that adapter-only checkpoints build on (default: the "
        "folder recorded in the checkpoint; set it when the base has moved).",
    )
    # vision-language models (verl's and MindSpeed-MM's freeze switches)
    freeze_vision_tower: bool = opt(
        False, "Vision-language models: the tower's blocks and patch embedding do not train (the projector does)."
    )
    freeze_projector: bool = opt(
        False, "Vision-language models: the projector (the patch merger into the language model) does not train."
    )
    # checkpoints
    load: Optional[str] = opt(None, "Checkpoint folder to load (Megatron layout).")
    save: Optional[str] = opt(None, "Checkpoint folder to save into.")
    finetune: bool = opt(
        True,
        "true: load weights only and start at iteration 0; false: resume iteration, data position, optimizer and RNG.",
    )
    no_load_optim: bool = opt(False, "On resume, do not load the optimizer state.")
    no_load_rng: bool = opt(False, "On resume, do not load the RNG states.")
    no_save_optim: bool = opt(False, "Do not save the optimizer state.")
    no_save_rng: bool = opt(False, "Do not save the RNG states.")
    save_hf: bool = opt(
        False,
        "With every checkpoint also write its HF folder (safetensors, config.json, tokenizer "
        "files) beside it as <save>/iter_XXXXXXX_hf, loadable by transformers and vLLM as it "
        "is; a critic's in the --orm form. Needs save and a filesystem all ranks share.",
    )
    no_shared_storage: bool = opt(False, "Nodes do not share a filesystem (each node writes its own shards).")
    # data
    data_path: Optional[str] = opt(None, "Prefix of the preprocessed dataset (cli/preprocess_data.py output_prefix).")
    test_data_path: Optional[str] = opt(
        None,
        "Prefix of the preprocessed test set, evaluated on the rollout engines "
        "(rl_config.test_freq, val_before_train, val_kwargs).",
    )
    split: str = opt("100,0,0", "train,valid,test split weights.")
    no_shuffle: bool = opt(False, "Serve prompts in file order.")
    full_shuffle_instruction_dataset: bool = opt(False, "Shuffle across epochs as one permutation.")
    no_pad_to_seq_lengths: bool = opt(False, "Pad batches to their longest sample, not to seq_length.")
    dataset_additional_keys: List[str] = opt(
        doc="Extra dataset fields carried with each prompt (e.g. labels).", factory=list
    )

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def virtual_stages(self, num_layers: int) -> int:
        """Model chunks per pipeline rank (1: no interleaving)."""
        if self.num_layers_per_virtual_pipeline_stage:
            per_rank = num_layers // self.pipeline_model_parallel_size
            return max(1, per_rank // self.num_layers_per_virtual_pipeline_stage)
        return self.virtual_pipeline_model_parallel_size or 1

    def stage_layers(self, num_layers: int) -> List[List[int]]:
        """Per pipeline rank, the global layer numbers it holds in its own order (``pipeline_layers``)."""
        counts = self.layers_per_stage(num_layers) if self.num_layer_list else None
        return pipeline_layers(num_layers, self.pipeline_model_parallel_size, self.virtual_stages(num_layers), counts)

    def layers_per_stage(self, num_layers: int) -> List[int]:
        if self.num_layer_list:
            return [int(x) for x in self.num_layer_list.split(",")]
        pp = self.pipeline_model_parallel_size
        return [num_layers // pp] * pp


def pipeline_layers(num_layers: int, pp: int, vpp: int = 1, counts: Optional[List[int]] = None) -> List[List[int]]:
    """Per pipeline rank, the global layer numbers it holds in its own order: a contiguous block (``counts[r]``
    layers, or an equal share), or with VPP > 1 its model chunks' blocks, chunk c of rank r being virtual stage
    c x PP + r of PP x VPP equal stages."""
    if vpp > 1:
        per = num_layers // (pp * vpp)
        return [[(c * pp + r) * per + i for c in range(vpp) for i in range(per)] for r in range(pp)]
    out, start = [], 0
    for count in counts or [num_layers // pp] * pp:
        out.append(list(range(start, start + count)))
        start += count
    return out


# MindSpeed's switches: key -> its command-line flag (the adaptor reads them from the process's arguments)
MINDSPEED_SWITCHES = {
    "recompute_norm": "--recompute-norm",
    "recompute_norm_num_layers": "--recompute-norm-num-layers",
    "recompute_activation_function": "--recompute-activation-function",
    "recompute_activation_function_num_layers": "--recompute-activation-function-num-layers",
    "swap_optimizer": "--swap-optimizer",
    "reuse_fp32_param": "--reuse-fp32-param",
    "swap_attention": "--swap-attention",
    "moe_hierarchical_alltoallv": "--moe-hierarchical-alltoallv",
}
# what megatron-core itself recomputes selectively (of its modules, the ones our layer specs build)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe")


def mindspeed_argv(m: MegatronConfig) -> List[str]:
    """The MindSpeed flags of a role's switches that are on (booleans as bare flags, counts with their value)."""
    argv: List[str] = []
    for key, flag in MINDSPEED_SWITCHES.items():
        value = getattr(m, key)
        if value is True:
            argv.append(flag)
        elif value not in (None, False):
            argv += [flag, str(value)]
    return argv
