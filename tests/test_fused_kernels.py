"""Fused RMSNorm / SwiGLU / RoPE (models/fused_kernels.py): which role gets liger-kernel's kernels on which device,
the module swap on a built model, and the SwiGLU and RoPE kernels' parity with megatron's MLP and RoPE
(liger-kernel's Triton code run on CPU by Triton's interpreter). The RMSNorm kernel does not run in the
interpreter: its parity is a step of the device check (bench/device_check.py, step fused_kernels)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from mindspeed_rl.accelerator import accelerator_class
from mindspeed_rl.accelerator import cpu as cpu_accelerator
from mindspeed_rl.config_cls import MegatronConfig
from mindspeed_rl.features import fused_kernels as kernel_choice
from mindspeed_rl.models import fused_kernels
from tests.helpers import tiny_model_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = dict(accelerator_class("cpu").fused_features(), sequence_parallel=True, flash_attn=True, compiled_kernels=False)
COMPILED = dict(accelerator_class("cpu").fused_features(), compiled_kernels=True)
LIGER = dict(CUDA, liger_kernels=True, fused_rmsnorm=True, fused_swiglu=True)
BOTH = dict(use_fused_rmsnorm=True, use_fused_swiglu=True, use_fused_rotary_pos_emb=True)


def choice(features, kind="cuda", model=None, **megatron):
    return kernel_choice.choose(MegatronConfig(model="tiny", **megatron), model or tiny_model_config(), features, kind)


def test_the_flags_and_the_device_choose_the_kernels():
    assert choice(LIGER) == kernel_choice.FusedKernels(by="liger-kernel")  # not asked: torch's modules, no note
    assert choice(LIGER, **BOTH) == kernel_choice.FusedKernels(True, True, True, by="liger-kernel")
    assert choice(LIGER, use_fused_swiglu=True).config_fields() == dict(
        bias_activation_fusion=False, use_te_activation_func=True
    )
    assert choice(LIGER, use_fused_rmsnorm=True).config_fields() == {}
    # no liger-kernel (CUDA without it, a CPU without a C++ compiler): torch's modules, one note per flag
    for features, kind in ((dict(COMPILED, compiled_kernels=False), "cpu"), (CUDA, "cuda")):
        kernels = choice(features, kind, **BOTH)
        assert (kernels.rmsnorm, kernels.swiglu) == (False, False)
        assert kernels.notes == (f"{', '.join(BOTH)}: no such kernel on {kind}; torch's runs",)
    # a CPU that compiles C++: torch.compile's, with the same exceptions as liger-kernel's
    assert choice(COMPILED, "cpu", **BOTH) == kernel_choice.FusedKernels(True, True, True, by="torch.compile")
    assert choice(dict(LIGER, compiled_kernels=True), **BOTH).by == "liger-kernel"  # the library first
    assert not choice(COMPILED, "cpu", use_fused_rotary_pos_emb=True, context_parallel_size=2).rope
    # Transformer Engine's layer spec fuses them itself; a LoRA role runs the local spec, so liger-kernel's
    te = dict(LIGER, transformer_engine=True, rope_fusion=True)
    assert choice(te, **BOTH) == kernel_choice.FusedKernels(by="Transformer Engine")
    assert choice(te, lora_r=4, lora_target_modules=["linear_qkv"], **BOTH).rmsnorm
    # NPU: MindSpeed's adaptor fuses them (no note, nothing swapped)
    npu_class = accelerator_class("npu")
    npu = kernel_choice.choose(
        MegatronConfig(model="tiny", **BOTH),
        tiny_model_config(),
        npu_class.fused_features(),
        "npu",
        npu_class.fused_kernels_by,
    )
    assert npu == kernel_choice.FusedKernels(by="MindSpeed") and npu.summary() == "MindSpeed's"
    layer_norm = choice(LIGER, model=tiny_model_config(normalization="LayerNorm"), **BOTH)
    assert (layer_norm.rmsnorm, layer_norm.swiglu) == (False, True)
    assert layer_norm.notes == ("use_fused_rmsnorm: LayerNorm is not fused",)
    assert not choice(LIGER, model=tiny_model_config(swiglu=False), **BOTH).swiglu
    # RoPE: megatron's hook serves the standard attention's rotary embedding of whole rows
    for model, why in (
        (tiny_model_config(position_embedding_type="mrope", mrope_section=[2, 3, 3]), "mrope"),
        (tiny_model_config(multi_latent_attention=True), "multi-latent attention"),
    ):
        kernels = choice(LIGER, model=model, use_fused_rotary_pos_emb=True)
        assert not kernels.rope and kernels.notes == (f"use_fused_rotary_pos_emb: not with {why}; torch's runs",)
    assert not choice(LIGER, use_fused_rotary_pos_emb=True, context_parallel_size=2).rope


def build(megatron: MegatronConfig, seed: int = 5):
    from mindspeed_rl.models.builder import build_gpt_model
    from mindspeed_rl.utils import dist

    dist.init_model_parallel(seed=seed)
    return build_gpt_model(tiny_model_config(), megatron)


def forward_backward(gpt, tokens):
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    mask = torch.triu(torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool), 1)[None, None]
    logits = gpt(tokens, positions, mask.expand(tokens.shape[0], 1, -1, -1))
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in gpt.named_parameters()}


def pretend_liger_on_cpu(monkeypatch) -> None:
    """The CPU accelerator reports liger-kernel; megatron's fused-RoPE hooks are restored afterwards."""
    from megatron.core.models.common.embeddings import rope_utils

    cpu = accelerator_class("cpu")
    monkeypatch.setattr(cpu, "fused_features", classmethod(lambda cls: dict(LIGER)))
    for hook in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
        monkeypatch.setattr(rope_utils, hook, getattr(rope_utils, hook))


class TorchRMSNorm(torch.autograd.Function):
    """liger-kernel's RMSNorm signature, torch's arithmetic."""

    @staticmethod
    def forward(ctx, x, w, eps, offset, casting_mode, in_place):
        # torch's arithmetic is liger-kernel's "gemma" casting; in place would overwrite what a recomputation reads
        assert (offset, casting_mode, in_place) == (0.0, "gemma", False)
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return torch.nn.functional.rms_norm(x, w.shape, w, eps)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
            out = torch.nn.functional.rms_norm(x, w.shape, w, ctx.eps)
            gx, gw = torch.autograd.grad(out, (x, w), grad)
        return gx, gw, None, None, None, None


class TorchRope:
    """liger-kernel's RoPE signature (q [b, h, s, d], k, cos / sin [b, s, d]), torch's arithmetic."""

    @staticmethod
    def apply(q, k, cos, sin):
        def rotate(x):
            first, second = x.chunk(2, dim=-1)
            return x * cos[:, None] + torch.cat([-second, first], dim=-1) * sin[:, None]

        return rotate(q), rotate(k)


class TorchSwiGLU:
    @staticmethod
    def apply(y, in_place):
        gate, up = y.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up


def torch_arithmetic_for_the_kernels(monkeypatch) -> None:
    """The kernels' functions as torch formulas: the swap's wiring runs on CPU, whose Triton cannot."""
    import liger_kernel.ops
    import liger_kernel.ops.rope

    monkeypatch.setattr(liger_kernel.ops.rope, "LigerRopeFunction", TorchRope)
    monkeypatch.setattr(liger_kernel.ops, "LigerRMSNormFunction", TorchRMSNorm)
    monkeypatch.setattr(liger_kernel.ops, "LigerFusedGateUpSiLUMulFunction", TorchSwiGLU)


def test_a_built_model_swaps_its_modules_and_keeps_its_parameters(monkeypatch):
    """Every torch RMSNorm and every MLP activation is swapped, the parameters (objects, names) stay; with the
    kernels' functions standing in as torch formulas the model computes what the unfused one does."""
    from megatron.core.transformer.mlp import MLP

    from mindspeed_rl.utils import dist

    dist.init_distributed()
    try:
        plain = build(MegatronConfig(model="tiny"))
        pretend_liger_on_cpu(monkeypatch)
        fused = build(MegatronConfig(model="tiny", **BOTH))
        assert not any(type(m) is torch.nn.RMSNorm for m in fused.modules())
        norms = [m for m in fused.modules() if isinstance(m, fused_kernels.FusedRMSNorm)]
        assert len(norms) == 2 * 2 + 1  # two per layer and the final one
        mlps = [m for m in fused.modules() if isinstance(m, MLP)]
        assert len(mlps) == 2 and all(isinstance(m.activation_func, fused_kernels.FusedSwiGLU) for m in mlps)
        assert fused.config.use_te_activation_func and not fused.config.bias_activation_fusion
        assert fused.config.apply_rope_fusion and not plain.config.apply_rope_fusion
        assert list(fused.state_dict()) == list(plain.state_dict())
        fused.load_state_dict(plain.state_dict())

        torch_arithmetic_for_the_kernels(monkeypatch)
        tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
        (want, want_grads), (got, got_grads) = forward_backward(plain, tokens), forward_backward(fused, tokens)
        assert torch.allclose(got, want, atol=1e-6)
        for name in want_grads:
            assert torch.allclose(got_grads[name], want_grads[name], atol=1e-6), name
    finally:
        dist.destroy()


def test_a_kernel_torch_compile_cannot_build_runs_as_written(caplog):
    """A compiler that fails (here: one that exits 1): one warning naming the kernel, then torch's version."""
    import torch._inductor.config

    @fused_kernels.compiled
    def cube_plus_one(x):
        return x * x * x + 1.0

    x = torch.randn(5, 3)
    with torch._inductor.config.patch({"cpp.cxx": (None, "false"), "fx_graph_cache": False}):
        with caplog.at_level("WARNING"):
            first, second = cube_plus_one(x), cube_plus_one(x)
    assert torch.equal(first, x * x * x + 1.0) and torch.equal(second, first)
    assert caplog.text.count("torch.compile could not build cube_plus_one") == 1


def test_threads_inside_kernel_calls_at_once_leave_the_process_stance_as_it_was():
    """The stance is the process's: the last thread out of overlapping kernel calls restores force_eager (what an
    eager vLLM engine's process set), not the first one's view of it."""
    import threading

    from torch._dynamo import eval_frame

    inside, leave = threading.Barrier(3), threading.Event()
    seen = []

    def call(wait: bool):
        with fused_kernels.torch_compile_on():
            seen.append(eval_frame._stance.stance)
            inside.wait()
            if wait:
                leave.wait()

    with torch.compiler.set_stance("force_eager"):
        threads = [threading.Thread(target=call, args=(wait,)) for wait in (False, True)]
        for t in threads:
            t.start()
        inside.wait()  # both inside; the first leaves while the second stays
        threads[0].join()
        assert eval_frame._stance.stance == "default"
        leave.set()
        threads[1].join()
        assert seen == ["default", "default"] and eval_frame._stance.stance == "force_eager"


@pytest.mark.skipif(not cpu_accelerator.torch_compile_can_build(), reason="torch.compile cannot build C++ here")
def test_on_cpu_torch_compiles_the_kernels_even_where_torch_compile_is_off(monkeypatch):
    """A CPU that compiles C++: the built model's norms and MLP activations are torch.compile's and its RoPE hook
    too; with torch.compile off in the process (what ``allow_torch_compile(False)`` sets beside an eager vLLM
    engine) they still compile, and the model computes what the unfused one does (fp32, 1e-5); the RoPE hooks'
    packed layout rotates each token by its position in its row."""
    import torch._dynamo
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer.mlp import MLP
    from torch._dynamo.utils import counters

    from mindspeed_rl.utils import dist

    monkeypatch.setattr(accelerator_class("cpu"), "fused_features", classmethod(lambda cls: dict(COMPILED)))
    for hook in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
        monkeypatch.setattr(rope_utils, hook, None)
    dist.init_distributed()
    try:
        with torch.compiler.set_stance("force_eager"), torch._dynamo.config.patch(disable=True):
            plain = build(MegatronConfig(model="tiny"))
            fused = build(MegatronConfig(model="tiny", **BOTH))
            assert len([m for m in fused.modules() if isinstance(m, fused_kernels.CompiledRMSNorm)]) == 2 * 2 + 1
            mlps = [m for m in fused.modules() if isinstance(m, MLP)]
            assert all(isinstance(m.activation_func, fused_kernels.CompiledSwiGLU) for m in mlps)
            assert rope_utils.fused_apply_rotary_pos_emb is fused_kernels.compiled_rope_bshd
            fused.load_state_dict(plain.state_dict())
            tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
            captured = counters["stats"]["unique_graphs"]
            (want, want_grads), (got, got_grads) = forward_backward(plain, tokens), forward_backward(fused, tokens)
            assert counters["stats"]["unique_graphs"] >= captured + 3  # compiled, not run eagerly
        assert float((got - want).abs().max()) <= 1e-5
        for name in want_grads:
            assert float((got_grads[name] - want_grads[name]).abs().max()) <= 1e-5, name
        # the hooks' layouts (padded, packed rows, partial rotary dims) with the formula they compile, uncompiled
        monkeypatch.setattr(fused_kernels, "rotate", fused_kernels.rotate.__wrapped__)
        assert rope_hooks_parity(fused_kernels.compiled_rope_bshd, fused_kernels.compiled_rope_thd) <= 1e-6
    finally:
        torch._dynamo.reset()
        dist.destroy()


def rope_hooks_parity(bshd=None, thd=None) -> float:
    """A RoPE through megatron's hooks (default: liger-kernel's) against megatron's unfused RoPE, padded [s, b] and
    packed rows, whole and partial rotary dimensions: the largest difference of outputs and gradients (fp32)."""
    from megatron.core.models.common.embeddings import rope_utils

    class OneRank:
        def size(self):
            return 1

        def rank(self):
            return 0

    g = torch.Generator().manual_seed(4)
    worst = 0.0
    bshd, thd = bshd or fused_kernels.rope_bshd, thd or fused_kernels.rope_thd
    for rotary in (16, 8):
        inverse = 1.0 / 10000 ** (torch.arange(0, rotary, 2).float() / rotary)
        angles = torch.arange(40).float()[:, None] * inverse
        freqs = torch.cat([angles, angles], -1)[:, None, None, :]
        cu = torch.tensor([0, 5, 9, 17], dtype=torch.int32)
        cases = (
            (
                torch.randn(12, 3, 4, 16, generator=g),
                rope_utils._apply_rotary_pos_emb_bshd,
                bshd,
                (),
            ),
            (torch.randn(17, 4, 16, generator=g), rope_utils._apply_rotary_pos_emb_thd, thd, (cu,)),
        )
        for t, unfused, fused, rows in cases:
            t.requires_grad_(True)
            kwargs = {"cp_group": OneRank()} if rows else {}
            want = unfused(t, *rows, freqs[: t.shape[0]] if not rows else freqs, **kwargs)
            got = fused(t, *rows, freqs[: t.shape[0]] if not rows else freqs)
            grad = torch.randn(want.shape, generator=g)
            # liger-kernel rotates the incoming gradient in place: each backward gets its own copy
            (got_grad,), (want_grad,) = (torch.autograd.grad(o, t, grad.clone()) for o in (got, want))
            worst = max(worst, float((got - want).abs().max()), float((got_grad - want_grad).abs().max()))
    # tokens after the last packed row keep position 0: unrotated
    tail = torch.randn(20, 4, 16, generator=g)
    out = thd(tail, torch.tensor([0, 5, 9, 17], dtype=torch.int32), freqs)
    worst = max(worst, float((out[17:] - tail[17:]).abs().max()))
    return worst


def swiglu_parity_in_the_interpreter() -> None:
    """Run with TRITON_INTERPRET=1 (subprocess): liger-kernel's SwiGLU and RoPE kernels in a built model against
    megatron's unfused MLP and RoPE in fp32, then the RoPE hooks alone; prints the largest differences."""
    import pytest as _pytest  # the monkeypatch fixture's class, outside pytest

    from mindspeed_rl.utils import dist

    patch = _pytest.MonkeyPatch()
    dist.init_distributed()
    try:
        plain = build(MegatronConfig(model="tiny"))
        pretend_liger_on_cpu(patch)
        fused = build(MegatronConfig(model="tiny", use_fused_swiglu=True, use_fused_rotary_pos_emb=True))
        assert fused.config.apply_rope_fusion
        fused.load_state_dict(plain.state_dict())
        tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
        (want, want_grads), (got, got_grads) = forward_backward(plain, tokens), forward_backward(fused, tokens)
        grad = max(float((got_grads[n] - want_grads[n]).abs().max()) for n in want_grads)
        print(f"logits {float((got - want).abs().max()):.3g} gradients {grad:.3g} rope {rope_hooks_parity():.3g}")
    finally:
        patch.undo()
        dist.destroy()


@pytest.mark.slow
def test_liger_swiglu_and_rope_kernels_match_megatron_in_fp32():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    code = "from tests.test_fused_kernels import swiglu_parity_in_the_interpreter as p; p()"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [row for row in out.stdout.splitlines() if row.startswith("logits ")][-1]
    _, logits, _, grads, _, rope = line.split()
    assert float(logits) <= 1e-5 and float(grads) <= 1e-5 and float(rope) <= 1e-5, line


def test_the_device_checks_fused_kernels_step_runs_with_stand_ins(monkeypatch):
    """bench/device_check.py's fused_kernels step (its code path, on CPU with the stand-ins): parity rows of 0
    difference with every module swapped, and the training rows with each kernel set."""
    from bench import device_kernels
    from bench.device_steps import Context

    ctx = Context(smoke=True)
    try:
        assert device_kernels.kernel_rows(ctx) == [
            dict(check="fused kernels", result="skipped: no liger-kernel kernels on cpu")
        ]
        pretend_liger_on_cpu(monkeypatch)
        torch_arithmetic_for_the_kernels(monkeypatch)
        rows = device_kernels.kernel_rows(ctx)
    finally:
        ctx.close()
    parity = [r for r in rows if r["check"] == "parity"]
    assert [r["dtype"] for r in parity] == ["fp32", "bf16"]
    for row in parity:
        assert row["modules_swapped"] == 2 * 2 + 1 + 2, row  # toy-2L: five norms, two MLP activations
        assert row["max_abs_logprob_diff"] < 1e-5 and row["loss_rel_diff"] < 1e-5 and row["grad_norm_rel_diff"] < 1e-4
    speed = [r for r in rows if r["check"] == "training"]
    assert [(r["seq"], r["kernels"]) for r in speed] == [
        (64, "torch"),
        (64, "liger-kernel"),
    ]
    assert all(r["tokens_per_s"] > 0 for r in speed)


def test_on_cuda_megatrons_compiled_regions_run_only_where_they_fuse_something(monkeypatch):
    """megatron compiles its SwiGLU and bias-dropout-add (torch.compile), which recompiled as packed lengths varied
    on an H100: without dropout or a bias the bias-dropout-add is one addition and runs uncompiled; with
    liger-kernel's SwiGLU megatron's compiled one is off."""
    from mindspeed_rl.models.builder import transformer_config

    real_find_spec = importlib.util.find_spec
    installed = {"transformer_engine": None}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: installed.get(name, real_find_spec(name, *a)))
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    model = tiny_model_config()
    plain = transformer_config(model, MegatronConfig(model="tiny"), "cuda")
    assert not plain.bias_dropout_fusion and plain.bias_activation_fusion
    assert transformer_config(model, MegatronConfig(model="tiny", hidden_dropout=0.1), "cuda").bias_dropout_fusion
    assert transformer_config(
        tiny_model_config(disable_bias_linear=False), MegatronConfig(model="tiny"), "cuda"
    ).bias_dropout_fusion
    installed["liger_kernel"] = None  # not installed: megatron's compiled SwiGLU stays
    assert transformer_config(model, MegatronConfig(model="tiny", use_fused_swiglu=True), "cuda").bias_activation_fusion
    installed["liger_kernel"] = real_find_spec("json")
    fused = transformer_config(model, MegatronConfig(model="tiny", use_fused_swiglu=True), "cuda")
    assert not fused.bias_activation_fusion and fused.use_te_activation_func


def test_the_batch_plan_says_which_kernels_each_role_gets(monkeypatch):
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.features.loop import plan_lines

    asked = ["actor_config.use_fused_rmsnorm=true", "actor_config.use_fused_swiglu=true"]
    cfg = load_ppo_config("ppo_tiny_cpu", asked)
    assert not [x for x in plan_lines(load_ppo_config("ppo_tiny_cpu", [])) if x.startswith("  kernels   : actor")]
    cpu = accelerator_class("cpu")
    monkeypatch.setattr(cpu, "fused_features", classmethod(lambda cls: dict(COMPILED)))
    (line,) = [x for x in plan_lines(cfg) if x.startswith("  kernels   : actor")]
    assert line == "  kernels   : actor: torch.compile's RMSNorm, SwiGLU"
    monkeypatch.setattr(cpu, "fused_features", classmethod(lambda cls: dict(COMPILED, compiled_kernels=False)))
    (line,) = [x for x in plan_lines(cfg) if x.startswith("  kernels   : actor")]
    assert (
        line
        == "  kernels   : actor: torch's (use_fused_rmsnorm, use_fused_swiglu: no such kernel on cpu; torch's runs)"
    )
    monkeypatch.undo()
    # a cluster's config checked where its device is not: the kind asked for answers (no device needed)
    from mindspeed_rl.accelerator import reset_accelerator

    monkeypatch.setenv("MINDSPEED_RL_DEVICE", "npu")
    reset_accelerator()
    try:
        (line,) = [x for x in plan_lines(cfg) if x.startswith("  kernels   : actor")]
    finally:
        monkeypatch.delenv("MINDSPEED_RL_DEVICE")
        reset_accelerator()
    assert line == "  kernels   : actor: MindSpeed's"
    pretend_liger_on_cpu(monkeypatch)
    (line,) = [x for x in plan_lines(cfg) if x.startswith("  kernels   : actor")]
    assert line == "  kernels   : actor: liger-kernel's RMSNorm, SwiGLU"
