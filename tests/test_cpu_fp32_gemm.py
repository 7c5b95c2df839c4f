"""megatron's linear layers on AMD CPUs with AVX-512: fp32 products through oneDNN (MKL runs its AVX2 code there), with
megatron's values and gradients, and megatron's own function wherever anything else is asked of it."""

import inspect

import pytest
import torch

from mindspeed_rl.accelerator.megatron_cpu_kernels import OneDnnLinear, fp32_by_onednn, fp32_gemm_library
from tests.helpers import single_process_world_fixture

single_process_world = single_process_world_fixture()


def megatron_linear():
    from megatron.core.tensor_parallel import layers

    linear = layers.linear_with_grad_accumulation_and_async_allreduce
    return getattr(linear, "megatron_linear", linear)


def test_the_fp32_library_follows_the_cpu_vendor_and_its_vector_isa():
    onednn = "onednn" if torch.backends.mkldnn.is_available() else "mkl"
    assert fp32_gemm_library("AuthenticAMD", "AVX512") == onednn
    assert fp32_gemm_library("AuthenticAMD", "AVX2") == fp32_gemm_library("AuthenticAMD", "") == "mkl"
    assert fp32_gemm_library("GenuineIntel", "AVX512") == fp32_gemm_library("", "AVX2") == "mkl"


def test_this_hosts_megatron_linears_take_the_library_its_vendor_gets():
    from megatron.core.tensor_parallel import layers

    from mindspeed_rl.accelerator.base import cpu_vendor
    from mindspeed_rl.accelerator.megatron_cpu_compat import apply

    apply()
    routed = fp32_gemm_library(cpu_vendor(), torch.backends.cpu.get_cpu_capability()) == "onednn"
    for name in ("linear_with_grad_accumulation_and_async_allreduce", "linear_with_frozen_weight"):
        assert hasattr(getattr(layers, name), "megatron_linear") == routed, name


@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_gives_megatron_s_values_and_gradients(bias):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, 3, 48, generator=g)
    weight, b = torch.randn(80, 48, generator=g), torch.randn(80, generator=g) if bias else None
    grad = torch.randn(9, 3, 80, generator=g)
    results = []
    for run in ("ours", "megatron"):
        inputs = [t.clone().requires_grad_() for t in (x, weight)] + ([b.clone().requires_grad_()] if bias else [None])
        if run == "ours":
            out = OneDnnLinear.apply(*inputs)
        else:
            out = megatron_linear()(inputs[0], inputs[1], inputs[2], False, False, False)
        out.backward(grad)
        results.append([out] + [t.grad for t in inputs if t is not None])
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    frozen = torch.randn(80, 48, generator=g)  # a frozen weight (a LoRA base, the reference): no gradient made
    x_grad = x.clone().requires_grad_()
    OneDnnLinear.apply(x_grad, frozen, None).sum().backward()
    assert frozen.grad is None and x_grad.grad is not None


def test_only_plain_fp32_cpu_products_are_routed():
    from mindspeed_rl.models.batch_invariant import batch_invariant

    calls = []
    linear = megatron_linear()

    def recorder(*args, **kwargs):
        calls.append("megatron")
        return linear(*args, **kwargs)

    recorder.__signature__ = inspect.signature(linear)  # type: ignore[attr-defined]
    routed = fp32_by_onednn(recorder)
    x, weight = torch.randn(4, 2, 16), torch.randn(8, 16)
    plain = dict(gradient_accumulation_fusion=False, allreduce_dgrad=False, sequence_parallel=False)
    expected = x @ weight.t()
    torch.testing.assert_close(routed(input=x, weight=weight, bias=None, **plain), expected)
    assert calls == []  # oneDNN's
    routed(x.bfloat16(), weight.bfloat16(), None, **plain)  # 16-bit: oneDNN's already, through torch
    with batch_invariant():  # a torch function mode watches the products: they stay torch calls
        routed(input=x, weight=weight, bias=None, **plain)
    with torch.no_grad():  # the tensor-parallel all-reduce of the input's gradient is megatron's to do
        routed(input=x, weight=weight, bias=None, **dict(plain, allreduce_dgrad=True))
    assert calls == ["megatron"] * 3
    assert routed.megatron_linear is recorder
