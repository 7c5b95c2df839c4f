"""Check this machine's stack: device, distributed backend, megatron-core forward+backward.

    python cli/check_env.py [--model tiny_qwen25] [--seq-length 128] [--batch 4]

Builds the model section's GPTModel on the detected device (MINDSPEED_RL_DEVICE overrides),
runs one forward and backward pass with a next-token loss, and prints the timings.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

from mindspeed_rl.config_cls import ConfigError, MegatronConfig, ModelConfig
from mindspeed_rl.config_cls.base import build_section
from mindspeed_rl.config_cls.loader import CONFIG_DIR
from mindspeed_rl.config_cls.ppo_config import model_section_data
from mindspeed_rl.utils.cli import report_user_errors


def load_model_section(name: str) -> ModelConfig:
    data = model_section_data(name, {}, CONFIG_DIR, "--model")
    model = build_section(ModelConfig, data, f"model.{name}")
    model.validate()
    return model


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny_qwen25")
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    if args.seq_length < 2 or args.batch < 1:
        raise ConfigError("--seq-length", "needs seq-length >= 2 and batch >= 1")
    model_cfg = load_model_section(args.model)

    import torch

    from mindspeed_rl.accelerator import get_accelerator
    from mindspeed_rl.models.builder import build_gpt_model
    from mindspeed_rl.utils import dist

    acc = get_accelerator()
    print(f"device     : {acc.describe()}")
    print(f"torch      : {torch.__version__}")
    dist.init_distributed()
    dist.init_model_parallel()
    megatron = MegatronConfig(model=args.model, bf16=args.bf16)
    t0 = time.perf_counter()
    gpt = build_gpt_model(model_cfg, megatron)
    n_params = sum(p.numel() for p in gpt.parameters())
    print(f"model      : {args.model}, {n_params / 1e6:.2f}M parameters, built in {time.perf_counter() - t0:.2f}s")
    device = acc.current_device()
    vocab = model_cfg.padded_vocab_size or 1024
    tokens = torch.randint(0, vocab, (args.batch, args.seq_length), device=device)
    positions = torch.arange(args.seq_length, device=device).unsqueeze(0).expand(args.batch, -1)
    mask = torch.triu(torch.ones(args.seq_length, args.seq_length, dtype=torch.bool, device=device), 1)
    mask = mask[None, None].expand(args.batch, 1, -1, -1)
    t0 = time.perf_counter()
    logits = gpt(tokens, positions, mask)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1))
    acc.synchronize()
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    loss.backward()
    acc.synchronize()
    t_bwd = time.perf_counter() - t0
    grads = sum(1 for p in gpt.parameters() if p.grad is not None)
    ntok = args.batch * args.seq_length
    print(f"forward    : loss {loss.item():.4f} (ln vocab = {torch.log(torch.tensor(float(vocab))).item():.4f}), "
          f"{t_fwd * 1e3:.1f} ms, {ntok / t_fwd:.0f} tokens/s")
    print(f"backward   : {t_bwd * 1e3:.1f} ms, gradients on {grads} of {len(list(gpt.parameters()))} tensors")
    mem = acc.memory_stats()
    print("memory     : " + ", ".join(f"{k} {v:.2f}" for k, v in mem.items()))
    dist.destroy()
    ok = torch.isfinite(loss).item() and grads == len(list(gpt.parameters()))
    print("check_env  : OK" if ok else "check_env  : FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
