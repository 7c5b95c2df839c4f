"""Time and peak host memory of hf -> mcore (TP 2) and back on a randomly initialised ~1B model.

    .venv/bin/python bench/convert.py [--workdir /tmp/convert_bench] [--layers 20] [--keep]

The HF folder is written shard by shard (safetensors + index, fp32) without building the model, so
the bench itself stays small; each conversion runs as a child process and its peak RSS is read
from the OS (ru_maxrss of the child).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_hf(folder: str, layers: int, hidden: int, ffn: int, heads: int, kv: int, vocab: int) -> int:
    os.makedirs(folder, exist_ok=True)
    d = hidden // heads
    g = torch.Generator().manual_seed(0)
    weight_map, total, n_params = {}, 0, 0

    def dump(name: str, tensors: dict) -> None:
        nonlocal total, n_params
        save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.numel() * 4
            n_params += v.numel()

    shard_names = [f"model-{i + 1:05d}-of-{layers + 2:05d}.safetensors" for i in range(layers + 2)]
    dump(shard_names[0], {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g) * 0.02})
    for i in range(layers):
        p = f"model.layers.{i}."
        dump(
            shard_names[i + 1],
            {
                p + "input_layernorm.weight": torch.ones(hidden),
                p + "post_attention_layernorm.weight": torch.ones(hidden),
                p + "self_attn.q_proj.weight": torch.randn(heads * d, hidden, generator=g) * 0.02,
                p + "self_attn.k_proj.weight": torch.randn(kv * d, hidden, generator=g) * 0.02,
                p + "self_attn.v_proj.weight": torch.randn(kv * d, hidden, generator=g) * 0.02,
                p + "self_attn.q_proj.bias": torch.zeros(heads * d),
                p + "self_attn.k_proj.bias": torch.zeros(kv * d),
                p + "self_attn.v_proj.bias": torch.zeros(kv * d),
                p + "self_attn.o_proj.weight": torch.randn(hidden, heads * d, generator=g) * 0.02,
                p + "mlp.gate_proj.weight": torch.randn(ffn, hidden, generator=g) * 0.02,
                p + "mlp.up_proj.weight": torch.randn(ffn, hidden, generator=g) * 0.02,
                p + "mlp.down_proj.weight": torch.randn(hidden, ffn, generator=g) * 0.02,
            },
        )
    dump(
        shard_names[-1],
        {"model.norm.weight": torch.ones(hidden), "lm_head.weight": torch.randn(vocab, hidden, generator=g) * 0.02},
    )
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)
    return n_params


WRAPPER = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def run(cmd) -> tuple:
    """(seconds, peak RSS in GiB) of ``cmd``, measured by a fresh wrapper process around it."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], check=True, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    return elapsed, int(out.stdout.strip().splitlines()[-1]) / 2**20  # KiB -> GiB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/convert_bench")
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    hf, mg = os.path.join(args.workdir, "hf"), os.path.join(args.workdir, "mg")
    shutil.rmtree(args.workdir, ignore_errors=True)
    n = write_hf(hf, args.layers, hidden=2048, ffn=5504, heads=16, kv=4, vocab=32000)
    size = n * 4 / 2**30
    print(f"model: {n / 1e9:.2f}B parameters, {size:.2f} GiB in fp32")
    py = sys.executable
    t1, rss1 = run(
        [
            py,
            "cli/convert_ckpt.py",
            "--load-model-type",
            "hf",
            "--save-model-type",
            "mg",
            "--load-dir",
            hf,
            "--save-dir",
            mg,
            "--target-tensor-parallel-size",
            "2",
            "--add-qkv-bias",
        ]
    )
    print(f"hf -> mg (TP 2): {t1:.1f} s, peak RSS {rss1:.2f} GiB ({rss1 / size:.2f}x the weights)")
    t2, rss2 = run(
        [
            py,
            "cli/convert_ckpt.py",
            "--load-model-type",
            "mg",
            "--save-model-type",
            "hf",
            "--load-dir",
            mg,
            "--save-dir",
            hf,
        ]
    )
    print(f"mg -> hf: {t2:.1f} s, peak RSS {rss2:.2f} GiB ({rss2 / size:.2f}x the weights)")
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
