"""Evaluate a checkpoint on benchmark suites: n samples per problem, scored by the training verifiers.

    python cli/evaluate.py --model ./ckpt/actor --tokenizer ./Qwen2.5-7B \\
        --suite ./dataset/gsm8k/test.jsonl --suite configs/eval/reasoning_gym.yaml --n 8 --k 1,4,8 --out eval/

--model: a HF folder, or a training checkpoint (its latest iteration; --tokenizer then names the run's tokenizer).
--suite: [NAME=]PATH of a data file (.jsonl, .json, .parquet, or a folder of them; fields found from the first row)
or a suite YAML (configs/eval/). Prints a table (pass@k with the unbiased estimator, maj@k, mean score, mean
response length, truncation rate) and writes <out>/results.json, <out>/<suite>.png and <out>/<suite>.samples.jsonl.
A missing file, an empty suite, k larger than n exit 2 naming them; rows without an answer are skipped and counted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

from mindspeed_rl.utils.cli import UserError, report_user_errors


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF folder or training checkpoint folder")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer folder (a training checkpoint needs it)")
    p.add_argument("--suite", action="append", required=True, help="[NAME=]PATH: data file or suite YAML; repeat")
    p.add_argument("--n", type=int, default=1, help="samples per problem")
    p.add_argument("--k", default=None, help="comma-separated k of pass@k / maj@k (default 1, 2, 4, ... and n)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--prompt-type", default="qwen_r1", help="chat template of suites that name none")
    p.add_argument("--temperature", type=float, default=None, help="default: 0 (greedy) for --n 1, else 1.0")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument(
        "--max-prompt-length",
        type=int,
        default=None,
        help="longer prompts are skipped and counted (default: the context less --max-new-tokens, at most 2048)",
    )
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's, at most 4096")
    p.add_argument("--limit", type=int, default=0, help="the first this many problems of each suite (0: all)")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    p.add_argument("--backend", default="auto", choices=("auto", "vllm", "megatron"))
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--verifier-workers", type=int, default=2, help="processes scoring the samples")
    return p.parse_args(argv)


def sampling_of(args):
    """The sampling settings and the k list, checked (UserError naming the flag)."""
    from mindspeed_rl.evaluation.engine import Sampling
    from mindspeed_rl.evaluation.scoring import default_ks
    from mindspeed_rl.features.evaluation import sampling_temperature

    for flag, value, least in (
        ("--n", args.n, 1),
        ("--max-new-tokens", args.max_new_tokens, 1),
        ("--max-prompt-length", args.max_prompt_length, 1),
        ("--max-model-len", args.max_model_len, 1),
        ("--limit", args.limit, 0),
        ("--tensor-parallel-size", args.tensor_parallel_size, 1),
        ("--verifier-workers", args.verifier_workers, 1),
    ):
        if value is not None and value < least:
            raise UserError(f"{flag} {value}: at least {least}")
    temperature = sampling_temperature(args.temperature, args.n)
    if not (math.isfinite(temperature) and temperature >= 0) or not 0 < args.top_p <= 1:
        raise UserError(f"--temperature {temperature} must be a number >= 0, --top-p {args.top_p} in (0, 1]")
    if temperature == 0 and args.n > 1:
        raise UserError(f"--n {args.n} with --temperature 0: greedy samples are all the same; give a temperature > 0")
    if args.k:
        try:
            ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
        except ValueError:
            raise UserError(f"--k {args.k}: comma-separated integers") from None
        bad = [k for k in ks if not 1 <= k <= args.n]
        if bad or not ks:
            raise UserError(f"--k {args.k}: each k between 1 and --n {args.n} (pass@k needs k of the n samples)")
    else:
        ks = default_ks(args.n)
    sampling = Sampling(args.n, temperature, args.top_p, args.top_k, args.max_new_tokens, args.seed)
    return sampling, ks


def lengths_of(args) -> Tuple[int, int]:
    """The engine's context (--max-model-len, or the model's up to 4096) and the longest prompt kept: one that
    leaves room for --max-new-tokens, so every response has its whole budget."""
    from mindspeed_rl.evaluation.engine import model_context

    max_model_len = args.max_model_len or min(4096, model_context(args.model, args.tokenizer))
    room = max_model_len - args.max_new_tokens
    if room < 1:
        raise UserError(f"--max-new-tokens {args.max_new_tokens}: no room for a prompt in a context of {max_model_len}")
    if args.max_prompt_length and args.max_prompt_length > room:
        raise UserError(
            f"--max-prompt-length {args.max_prompt_length} + --max-new-tokens {args.max_new_tokens} exceed the "
            f"context of {max_model_len} tokens (--max-model-len, or the model's max_position_embeddings)"
        )
    return max_model_len, args.max_prompt_length or min(2048, room)


def output_problem(out: str) -> Optional[str]:
    """Why ``out`` cannot be the output folder (None when it can: it is a writable folder, or can be made)."""
    path = os.path.abspath(out)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{path} is a file, not a folder"
    return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"


def load_suites(args, tokenizer, tokenizer_dir: str, max_prompt_length: int):
    from mindspeed_rl.evaluation.suites import SuiteError, load_suites

    try:
        suites = load_suites(args.suite, tokenizer, tokenizer_dir, args.prompt_type, max_prompt_length, args.limit)
    except SuiteError as exc:
        raise UserError(f"--suite: {exc}") from None
    for suite in suites:
        print(suite.summary(), flush=True)
        for example in suite.examples:
            print(f"  skipped {example}")
    return suites


def build_sampler(args, hf_dir: str, tokenizer, max_model_len: int):
    from mindspeed_rl.evaluation.engine import MegatronSampler, VllmSampler, engine_dtype, vllm_unusable

    dtype = engine_dtype(args.dtype)
    reason = vllm_unusable(hf_dir, dtype) if args.backend != "megatron" else "--backend megatron"
    if reason and args.backend == "vllm":
        raise UserError(f"--backend vllm: {reason}")
    if reason:
        print(f"engine: megatron-core ({reason})", flush=True)
        return MegatronSampler(hf_dir, tokenizer, args.seed)
    print(f"engine: vLLM, {dtype}, max_model_len {max_model_len}", flush=True)
    return VllmSampler(hf_dir, dtype, max_model_len, args.tensor_parallel_size, args.seed)


def write_samples(path: str, suite, samples, scores) -> None:
    with open(path + ".part", "w", encoding="utf-8") as fh:
        for i, label in enumerate(suite.prompts.labels):
            fh.write(
                json.dumps(
                    {
                        "problem": i,
                        "label": label,
                        "responses": samples.texts[i],
                        "scores": [float(s) for s in scores[i]],
                        "lengths": samples.lengths[i].tolist(),
                        "truncated": samples.truncated[i].tolist(),
                    }
                )
                + "\n"
            )
    os.replace(path + ".part", path)


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    sampling, ks = sampling_of(args)
    if not os.path.isdir(args.model):
        raise UserError(f"--model {args.model}: folder does not exist")
    problem = output_problem(args.out)
    if problem:
        raise UserError(f"--out {args.out}: {problem}")
    from mindspeed_rl.evaluation.engine import ModelError, hf_folder
    from mindspeed_rl.evaluation.report import draw_suite, table, write_json
    from mindspeed_rl.evaluation.scoring import evaluate_suite
    from mindspeed_rl.rewards.runner import RuleRewardRunner
    from mindspeed_rl.utils.hf_tokenizer import load_tokenizer

    try:
        max_model_len, max_prompt_length = lengths_of(args)  # reads the model's config: a bad --model stops here
    except ModelError as exc:
        raise UserError(str(exc)) from None
    tokenizer_dir = args.tokenizer or args.model
    tokenizer = load_tokenizer(tokenizer_dir, "--tokenizer" if args.tokenizer else "--model")
    suites = load_suites(args, tokenizer, tokenizer_dir, max_prompt_length)
    started = time.time()
    results, runners = {}, {}
    with tempfile.TemporaryDirectory(prefix="mindspeed_rl_eval_") as work:
        try:
            hf_dir = hf_folder(args.model, args.tokenizer, work)
            sampler = build_sampler(args, hf_dir, tokenizer, max_model_len)
            for suite in suites:
                runner = runners.setdefault(
                    suite.verifier, RuleRewardRunner([suite.verifier], [1.0], workers=args.verifier_workers)
                )
                results[suite.name], samples, scores = evaluate_suite(sampler, suite, sampling, ks, runner)
                lengths: List[int] = samples.lengths.flatten().tolist()
                draw_suite(os.path.join(args.out, f"{suite.name}.png"), suite.name, results[suite.name], ks, lengths)
                write_samples(os.path.join(args.out, f"{suite.name}.samples.jsonl"), suite, samples, scores)
        except ModelError as exc:
            raise UserError(str(exc)) from None
        finally:
            for runner in runners.values():
                runner.close()
    print(table(results, ks))
    payload = {
        "model": os.path.abspath(args.model),
        "engine": sampler.name,
        "sampling": vars(sampling),
        "k": ks,
        "seconds": round(time.time() - started, 1),
        "suites": {
            s.name: {"verifier": s.verifier, "source": s.source, "skipped": s.skipped, "metrics": results[s.name]}
            for s in suites
        },
    }
    write_json(os.path.join(args.out, "results.json"), payload)
    print(f"wrote {os.path.join(args.out, 'results.json')} and a PNG per suite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
