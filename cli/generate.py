"""Generate responses from a Megatron checkpoint (its stored config suffices) or a HF folder.

    python cli/generate.py --load-dir ./ckpt --tokenizer-name-or-path ./Qwen2.5-7B \\
        --input prompts.jsonl --output out.jsonl [--max-new-tokens 128] [--temperature 0] [--top-p 1] [--seed 1]

Input: jsonl with a "prompt" per line (text, used as is). Output: one jsonl line per prompt with
prompt, response (text), token_ids (the response's ids) and logprobs (per response token).
Runs on one device with the megatron-core model (any TP/PP checkpoint is merged first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from mindspeed_rl.utils.cli import UserError, report_user_errors


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load-dir", required=True, help="Megatron checkpoint folder or HF model folder")
    p.add_argument("--tokenizer-name-or-path", default=None, help="HF tokenizer folder (default: --load-dir)")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    return p.parse_args(argv)


def read_prompts(path: str):
    if not os.path.isfile(path):
        raise UserError(f"--input {path}: file does not exist")
    prompts = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise UserError(f"{path}:{number}: needs a string field 'prompt'")
            prompts.append(row["prompt"])
    if not prompts:
        raise UserError(f"{path}: no prompts")
    return prompts


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.temperature < 0 or args.max_new_tokens < 1:
        raise UserError("--temperature must be >= 0 and --max-new-tokens >= 1")
    prompts = read_prompts(args.input)
    tok_dir = args.tokenizer_name_or_path or args.load_dir
    if not os.path.isdir(tok_dir):
        raise UserError(f"--tokenizer-name-or-path {tok_dir}: folder does not exist")
    from tqdm import tqdm

    from mindspeed_rl.rollout.engines.fallback import generate
    from mindspeed_rl.utils import dist
    from mindspeed_rl.utils.hf_tokenizer import decode_known, load_tokenizer

    tokenizer = load_tokenizer(tok_dir, "--tokenizer-name-or-path")
    dist.init_distributed()
    dist.init_model_parallel(seed=args.seed)
    from mindspeed_rl.checkpoint.errors import ConversionError
    from mindspeed_rl.checkpoint.megatron_layout import CheckpointError
    from mindspeed_rl.models.loading import ModelLoadError, load_generation_model

    try:
        gpt, _ = load_generation_model(args.load_dir)
    except (CheckpointError, ConversionError, ModelLoadError) as exc:  # truncated, crafted or incomplete: named, exit 2
        raise UserError(f"--load-dir {args.load_dir}: {exc}") from None
    encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    results = []
    for start in tqdm(range(0, len(encoded), args.batch_size), desc="generate", unit="batch"):
        results += generate(
            gpt,
            encoded[start : start + args.batch_size],
            args.max_new_tokens,
            tokenizer.eos_token_id,
            pad,
            args.temperature,
            args.top_k,
            args.top_p,
            seed=args.seed + start,
        )
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output + ".part", "w", encoding="utf-8") as fh:
        for prompt, out in zip(prompts, results):
            text, _ = decode_known(tokenizer, out.response_ids)
            fh.write(
                json.dumps(
                    {
                        "prompt": prompt,
                        "response": text,
                        "token_ids": out.response_ids,
                        "logprobs": out.logprobs,
                        "finish_reason": out.finish_reason,
                    }
                )
                + "\n"
            )
    os.replace(args.output + ".part", args.output)
    dist.destroy()
    print(f"wrote {len(results)} responses to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
