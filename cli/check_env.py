"""Check this machine's stack, step by step; run it first on a new host (NPU, GPU or CPU).

    python cli/check_env.py [--stack npu] [--model tiny_qwen25] [--steps versions,imports,megatron,vllm,tools]

Steps, each with a verdict line:
  versions  torch / torch_npu / megatron-core / vLLM (vllm-ascend) / transformers / ray against
            requirements/<stack>.txt (default: whichever of the detected device's sets matches: on NPU
            npu or npu-current, on CPU cpu or a compatibility-stage set)
  imports   torch, the device's torch extension (torch_npu), MindSpeed's megatron adaptor before megatron-core
            is first imported, then vLLM
  megatron  one forward and backward of the model section on one device, with timings
  vllm      one vLLM engine on the same device, its weights updated in place from the megatron model (the
            rollout's path), then greedy generation whose log-probs must equal megatron's
  tools     the tool sandbox: one python tool call inside bubblewrap that must not see /etc/passwd nor start
            a process (a WARNING, not a failure, where bubblewrap cannot run: code tools are then refused)
Exit 0 when every step passes; 2 naming the first failure.

On an NVIDIA node, scripts/device_check.sh (bench/device_check.py) goes further: parity with transformers,
training tokens/s and MFU, the log-prob head, the RL math and generation, measured (docs/install.md, "An
offline node").
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

from mindspeed_rl.config_cls import ConfigError, MegatronConfig, ModelConfig
from mindspeed_rl.config_cls.loader import CONFIG_DIR
from mindspeed_rl.config_cls.ppo_config import model_section_data
from mindspeed_rl.trainer.startup.config_names import build_checked_model
from mindspeed_rl.utils.cli import UserError, report_user_errors

STEPS = ("versions", "imports", "megatron", "vllm", "tools")
LOGPROB_TOLERANCE = 1e-2  # fp32 on both sides: CPU measures ~1e-6; device kernels differ more


def load_model_section(name: str) -> ModelConfig:
    return build_checked_model(model_section_data(name, {}, CONFIG_DIR, "--model"), f"model.{name}")


def verdict(step: str, ok: bool, detail: str) -> None:
    print(f"{step:<10} : {'OK' if ok else 'FAILED'}  {detail}", flush=True)
    if not ok:
        raise UserError(f"check_env step '{step}' failed: {detail}")


def step_versions(stack: Optional[str], kind: str) -> None:
    """The installed versions against ``stack``'s pins, or (no ``stack``) against whichever of the device
    kind's sets they match (NPU: the maintained-branch set or the current images' set)."""
    from mindspeed_rl.compat.stack import DESCRIPTIONS, identify, mismatches, pinned

    if stack is None:
        stack, problems = identify(kind)
    else:
        problems = mismatches(stack)
    what = f"requirements/{stack}.txt, {DESCRIPTIONS.get(stack, stack)}"
    verdict(
        "versions",
        not problems,
        "; ".join(problems) + f" (closest set: {what})" if problems else f"{len(pinned(stack))} packages as {what}",
    )


def step_imports() -> None:
    import importlib

    import torch

    from mindspeed_rl.accelerator import get_accelerator

    acc = get_accelerator()  # imports the device's torch extension (torch_npu on NPU)
    early = sorted(m for m in sys.modules if m.startswith("megatron."))
    if early:
        verdict("imports", False, f"megatron-core was imported before the device's patches: {early[:3]}")
    acc.prepare_megatron()  # MindSpeed's adaptor on NPU, the CPU compatibility on CPU
    importlib.import_module("megatron.core")
    try:
        vllm = importlib.import_module("vllm")
        from vllm.platforms import current_platform

        platform = f"vLLM platform {type(current_platform).__name__}"
    except Exception as exc:  # noqa: BLE001 - any failure to import vLLM is the verdict
        verdict("imports", False, f"vLLM does not import: {type(exc).__name__}: {exc}")
    verdict("imports", True, f"torch {torch.__version__}, {acc.describe()}, {platform}, vllm {vllm.__version__}")


def step_megatron(model_cfg: ModelConfig, model_name: str, seq_length: int, batch: int, bf16: bool):
    import torch

    from mindspeed_rl.accelerator import get_accelerator
    from mindspeed_rl.models.builder import build_gpt_model
    from mindspeed_rl.utils import dist

    acc = get_accelerator()
    dist.init_distributed()
    dist.init_model_parallel()
    megatron = MegatronConfig(model=model_name, bf16=bf16)
    t0 = time.perf_counter()
    gpt = build_gpt_model(model_cfg, megatron)
    n_params = sum(p.numel() for p in gpt.parameters())
    t_build = time.perf_counter() - t0
    device = acc.current_device()
    vocab = model_cfg.padded_vocab_size or 1024
    tokens = torch.randint(0, vocab, (batch, seq_length), device=device)
    t0 = time.perf_counter()
    logits = forward(gpt, tokens)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )
    acc.synchronize()
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    loss.backward()
    acc.synchronize()
    t_bwd = time.perf_counter() - t0
    grads = sum(1 for p in gpt.parameters() if p.grad is not None)
    total = len(list(gpt.parameters()))
    ok = bool(torch.isfinite(loss).item()) and grads == total
    mem = ", ".join(f"{k} {v:.2f}" for k, v in acc.memory_stats().items())
    verdict(
        "megatron",
        ok,
        f"{model_name} {n_params / 1e6:.2f}M params built in {t_build:.2f}s; loss "
        f"{loss.item():.4f}; forward {t_fwd * 1e3:.1f} ms, backward {t_bwd * 1e3:.1f} ms, gradients on "
        f"{grads}/{total} tensors; memory {mem}",
    )
    return gpt


def forward(gpt, tokens):
    import torch

    seq = tokens.shape[1]
    positions = torch.arange(seq, device=tokens.device).unsqueeze(0).expand(tokens.shape[0], -1)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=tokens.device), 1)  # True = masked
    return gpt(tokens, positions, mask[None, None].expand(tokens.shape[0], 1, -1, -1))


def step_vllm(gpt, model_cfg: ModelConfig) -> None:
    import torch

    from mindspeed_rl.accelerator import get_accelerator
    from mindspeed_rl.config_cls import GenerateConfig, SamplingConfig
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.engines.factory import make_rollout_engine

    acc = get_accelerator()
    gen = GenerateConfig(
        backend="vllm",
        dtype="float32",
        max_model_len=128,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        gpu_memory_utilization=0.05,
    )
    t0 = time.perf_counter()
    engine = make_rollout_engine(model_cfg, gen, acc.kind, eos_token_id=0)
    if getattr(engine, "name", "") != "vllm":
        verdict("vllm", False, "vLLM cannot run this model here; the fallback engine was chosen")
    t_start = time.perf_counter() - t0
    weights = {name: p.detach().float() for name, p in gpt.state_dict().items() if "_extra_state" not in name}
    t0 = time.perf_counter()
    engine.update_weights([weights])
    t_sync = time.perf_counter() - t0
    prompt = [5, 17, 42, 9]
    out = engine.generate(RolloutRequest.of([prompt], SamplingConfig(temperature=0, max_tokens=16)))[0]
    engine.shutdown()
    if not out.response_ids:
        verdict("vllm", False, "greedy generation returned no token")
    tokens = torch.tensor([prompt + out.response_ids], device=acc.current_device())
    with torch.no_grad():
        logp = torch.log_softmax(forward(gpt, tokens).float(), dim=-1)[0]
    ours = torch.stack([logp[len(prompt) - 1 + i, t] for i, t in enumerate(out.response_ids)]).cpu()
    diff = (ours - torch.tensor(out.logprobs)).abs().max().item()
    verdict(
        "vllm",
        diff <= LOGPROB_TOLERANCE,
        f"engine up in {t_start:.1f}s, weights pushed by {engine.weight_load_method} in {t_sync * 1e3:.0f} ms, "
        f"{len(out.response_ids)} greedy tokens; max |log-prob(vLLM) - log-prob(megatron)| = {diff:.2e} "
        f"(tolerance {LOGPROB_TOLERANCE:g})",
    )


ISOLATION_PROBE = """
import os
try:
    open("/etc/passwd")
    print("sees the host's files")
except OSError:
    pass
try:
    os.fork()
    print("starts processes")
except OSError:
    pass
print("isolated")
"""


def step_tools() -> None:
    from mindspeed_rl.tools import Sandbox, SandboxLimits
    from mindspeed_rl.tools.isolation import INSTALL_HINT, bwrap_unavailable
    from mindspeed_rl.tools.syscall_filter import unavailable_reason

    why = bwrap_unavailable()
    if why:
        print(f"{'tools':<10} : WARNING  {why}: tools that run model code (python) will be refused; {INSTALL_HINT}")
        return
    start = time.perf_counter()
    result = Sandbox(SandboxLimits(), "bwrap").run("mindspeed_rl.tools.builtin:python", {"code": ISOLATION_PROBE})
    seconds = time.perf_counter() - start
    seccomp = unavailable_reason()
    isolated = result.ok and result.content == "isolated\n"
    verdict(
        "tools",
        isolated,
        f"bubblewrap isolates a python tool call ({seconds * 1000:.0f} ms), seccomp "
        + (f"off: {seccomp}" if seccomp else "on")
        if isolated
        else f"the probe call answered {result.status}: {result.content.strip()} {result.detail.strip()}",
    )


@report_user_errors
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny_qwen25")
    parser.add_argument("--stack", default=None, help="pin file to compare with (default: the device's)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    if args.seq_length < 2 or args.batch < 1:
        raise ConfigError("--seq-length", "needs seq-length >= 2 and batch >= 1")
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ConfigError("--steps", f"unknown step(s) {unknown}; choose from {', '.join(STEPS)}")
    model_cfg = load_model_section(args.model)

    from mindspeed_rl.accelerator import detect_device_kind

    if "versions" in steps:
        step_versions(args.stack, detect_device_kind())
    if "imports" in steps:
        step_imports()
    gpt = None
    if "megatron" in steps or "vllm" in steps:
        gpt = step_megatron(model_cfg, args.model, args.seq_length, args.batch, args.bf16)
    if "vllm" in steps:
        step_vllm(gpt, model_cfg)
    if "tools" in steps:
        step_tools()
    from mindspeed_rl.utils import dist

    dist.destroy()
    print("check_env  : OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
