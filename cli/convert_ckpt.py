"""Convert checkpoints between HF and Megatron-core layouts (MindSpeed-LLM's flags).

    # HF -> Megatron, TP 8 (critic / reward: add --orm). The family (qwen25, qwen3, llama3, qwen3_moe) and its
    # special cases come from config.json; --model-type-hf, when given, must agree with it.
    python cli/convert_ckpt.py --use-mcore-models --model-type GPT --load-model-type hf --save-model-type mg \\
        --target-tensor-parallel-size 8 --target-pipeline-parallel-size 1 --add-qkv-bias \\
        --load-dir ./Qwen2.5-32B --save-dir ./ckpt --model-type-hf qwen25 --params-dtype bf16 \\
        --tokenizer-model ./Qwen2.5-32B/tokenizer.json

    # Qwen3-MoE with the experts split over 4 expert-parallel ranks
    python cli/convert_ckpt.py --load-model-type hf --save-model-type mg --load-dir ./Qwen3-30B-A3B \\
        --save-dir ./ckpt_moe --target-tensor-parallel-size 4 --target-expert-parallel-size 4

    # Megatron -> HF: writes <save-dir>/mg2hf, config taken from the HF files in --save-dir (a LoRA run's
    # checkpoint: mg2hf holds the merged model and <save-dir>/mg2hf_adapter the adapters in PEFT's format)
    python cli/convert_ckpt.py --load-model-type mg --save-model-type hf --load-dir ./ckpt \\
        --save-dir ./Qwen2.5-32B --model-type-hf qwen25

    # Megatron -> Megatron with another TP/PP. A training checkpoint keeps its iteration, trainer state and
    # optimizer (Adam's moments split like their weights): resume from --save-dir with finetune: false
    python cli/convert_ckpt.py --load-model-type mg --save-model-type mg --load-dir ./ckpt \\
        --save-dir ./ckpt_tp4pp2 --target-tensor-parallel-size 4 --target-pipeline-parallel-size 2
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Optional, Sequence

from mindspeed_rl.config_cls.model_config import FAMILY_NAMES
from mindspeed_rl.utils.cli import UserError, report_user_errors


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load-model-type", choices=("hf", "mg"), required=True)
    p.add_argument("--save-model-type", choices=("hf", "mg"), required=True)
    p.add_argument("--load-dir", required=True)
    p.add_argument("--save-dir", required=True)
    p.add_argument("--target-tensor-parallel-size", type=int, default=1)
    p.add_argument("--target-pipeline-parallel-size", type=int, default=1)
    p.add_argument("--num-layer-list", default=None, help="uneven layers per pipeline stage, e.g. 3,5")
    p.add_argument(
        "--num-layers-per-virtual-pipeline-stage",
        type=int,
        default=None,
        help="an interleaved pipeline (VPP): layers per model chunk (the run's virtual_pipeline_model_parallel_size "
        "= layers / (PP x this))",
    )
    p.add_argument(
        "--model-type-hf",
        choices=FAMILY_NAMES,
        default=None,
        help="model family; default: read from config.json (a value that contradicts it is refused)",
    )
    p.add_argument(
        "--target-expert-parallel-size",
        type=int,
        default=1,
        help="split MoE experts over this many expert-parallel ranks",
    )
    p.add_argument(
        "--params-dtype",
        choices=("fp32", "bf16", "fp16"),
        default=None,
        help="dtype of the saved weights (default: fp32 for hf->mg, unchanged otherwise)",
    )
    p.add_argument(
        "--add-qkv-bias",
        action="store_true",
        help="assert that the model has q/k/v biases (the family and config.json decide; accepted for "
        "MindSpeed-LLM's command lines)",
    )
    p.add_argument("--tokenizer-model", default=None, help="tokenizer file or folder (checked to exist)")
    p.add_argument("--orm", action="store_true", help="critic / reward model: the value head <-> score.weight")
    p.add_argument("--use-mcore-models", action="store_true", help="accepted (megatron-core is the only kind)")
    p.add_argument("--model-type", default="GPT", choices=("GPT",))
    p.add_argument("--max-shard-size-gb", type=float, default=2.0, help="HF output shard size")
    p.add_argument(
        "--weights-only",
        action="store_true",
        help="mg -> mg: write the weights as 'release' even from a training checkpoint (no iteration, "
        "trainer or optimizer state)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write a Megatron checkpoint into a folder that holds training checkpoints: the new checkpoint "
        "replaces them entirely (every iteration and the tracker; HF copies iter_*_hf and other files stay)",
    )
    return p.parse_args(argv)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse (UserError, exit 2) what cannot be converted before anything is read or written."""
    if not os.path.isdir(args.load_dir):
        raise UserError(f"--load-dir {args.load_dir}: folder does not exist")
    if args.tokenizer_model and not os.path.exists(args.tokenizer_model):
        raise UserError(f"--tokenizer-model {args.tokenizer_model}: does not exist")
    for flag in ("target_tensor_parallel_size", "target_pipeline_parallel_size", "target_expert_parallel_size"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.save_model_type == "mg" and not args.force:
        from mindspeed_rl.checkpoint.megatron_layout import read_tracker_or_none

        tracker = read_tracker_or_none(args.save_dir) if os.path.isdir(args.save_dir) else None
        if tracker not in (None, "release"):
            raise UserError(
                f"--save-dir {args.save_dir}: holds training checkpoints (latest iteration {tracker}); "
                "converting into it would replace all of them. Choose another folder, or add --force"
            )


def hf_to_mg_command(args: argparse.Namespace) -> None:
    from mindspeed_rl.checkpoint import convert, hf_io
    from mindspeed_rl.checkpoint.replace import replacing

    if args.add_qkv_bias and not hf_io.read_hf_model_config(args.load_dir, args.model_type_hf).add_qkv_bias:
        raise UserError(
            f"--add-qkv-bias contradicts {os.path.join(args.load_dir, 'config.json')}: that "
            "model has no q/k/v bias (attention_bias false); drop the flag"
        )
    with replacing(args.save_dir) as out:
        cfg = convert.hf_to_mg(
            args.load_dir,
            out,
            args.target_tensor_parallel_size,
            args.target_pipeline_parallel_size,
            args.num_layer_list,
            args.params_dtype or "fp32",
            args.orm,
            args.model_type_hf,
            ep=args.target_expert_parallel_size,
            per_virtual_stage=args.num_layers_per_virtual_pipeline_stage,
        )
    where = args.save_dir
    ep = f", EP {args.target_expert_parallel_size}" if args.target_expert_parallel_size > 1 else ""
    print(
        f"converted {args.load_dir} ({cfg.model_type_hf}, {cfg.num_layers} layers) -> {where} "
        f"(TP {args.target_tensor_parallel_size}, PP {args.target_pipeline_parallel_size}{ep}, release)"
    )


def mg_to_hf_command(args: argparse.Namespace) -> None:
    from mindspeed_rl.checkpoint import convert, megatron_reader

    if not os.path.isfile(os.path.join(args.save_dir, "config.json")):
        raise UserError(
            f"--save-dir {args.save_dir}: needs the original HF config.json (and tokenizer "
            "files) to take the config from; the result goes to <save-dir>/mg2hf"
        )
    where = convert.mg_to_hf(
        args.load_dir, args.save_dir, args.params_dtype, args.orm or None, int(args.max_shard_size_gb * 1024**3)
    )
    print(f"converted {args.load_dir} -> {where}")
    if megatron_reader.read_mg_config(args.load_dir)[0].get("lora"):  # LoRA: the adapters on their own too
        from mindspeed_rl.checkpoint.peft_export import has_expert_adapters, write_peft_adapter

        if has_expert_adapters(args.load_dir):
            print(f"LoRA on MoE experts: no PEFT folder (transformers fuses the experts); {where} has "
                  "the adapters merged")  # fmt: skip
        else:
            adapter = write_peft_adapter(args.load_dir, os.path.join(args.save_dir, "mg2hf_adapter"), args.save_dir)
            print(f"LoRA adapters (PEFT) -> {adapter}; {where} has them merged")


def mg_to_mg_command(args: argparse.Namespace) -> None:
    from mindspeed_rl.checkpoint.replace import replacing
    from mindspeed_rl.checkpoint.reshard import mg_to_mg

    with replacing(args.save_dir) as out:
        iteration, kept_optim = mg_to_mg(
            args.load_dir,
            out,
            args.target_tensor_parallel_size,
            args.target_pipeline_parallel_size,
            args.num_layer_list,
            args.params_dtype,
            args.target_expert_parallel_size,
            args.weights_only,
            per_virtual_stage=args.num_layers_per_virtual_pipeline_stage,
        )
    kept = (
        "weights"
        if iteration == "release"
        else f"iteration {iteration}: weights, trainer state"
        + (", optimizer" if kept_optim else " (no optimizer state: resume with no_load_optim=true)")
    )
    print(
        f"resharded {args.load_dir} -> {args.save_dir} (TP {args.target_tensor_parallel_size}, "
        f"PP {args.target_pipeline_parallel_size}, EP {args.target_expert_parallel_size}; {kept})"
    )


COMMANDS = {("hf", "mg"): hf_to_mg_command, ("mg", "hf"): mg_to_hf_command, ("mg", "mg"): mg_to_mg_command}


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from mindspeed_rl.checkpoint.errors import ConversionError
    from mindspeed_rl.checkpoint.megatron_layout import CheckpointError

    check_arguments(args)
    command = COMMANDS.get((args.load_model_type, args.save_model_type))
    if command is None:
        raise UserError("hf -> hf is not a conversion; use --save-model-type mg")
    start = time.perf_counter()
    try:
        command(args)
    except (ConversionError, CheckpointError) as exc:
        raise UserError(str(exc)) from None
    print(f"done in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
