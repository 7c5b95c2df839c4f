"""The padded path's grouped-query attention (each group's query heads stacked along the rows) against
megatron-core's own DotProductAttention (keys and values repeated per query head): values and gradients."""

import dataclasses

import pytest
import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from mindspeed_rl.models.attention import PackedDotProductAttention
from mindspeed_rl.models.builder import transformer_config
from tests.helpers import single_process_world_fixture, tiny_role

single_process_world = single_process_world_fixture()


def attentions(heads: int, groups: int, dtype: torch.dtype):
    config = transformer_config(tiny_role().model, tiny_role().megatron)
    config = dataclasses.replace(
        config, num_attention_heads=heads, num_query_groups=groups, kv_channels=16, hidden_size=16 * heads
    )
    config.params_dtype, config.bf16 = dtype, dtype == torch.bfloat16
    return (cls(config, 1, AttnMaskType.causal, "self") for cls in (PackedDotProductAttention, DotProductAttention))


def padded_mask(batch: int, seq: int) -> torch.Tensor:
    """megatron's boolean mask [b, 1, s, s] (True: masked): causal, and each row's first b % 3 positions padding."""
    mask = torch.ones(seq, seq, dtype=torch.bool).triu(1).expand(batch, 1, seq, seq).clone()
    for b in range(batch):
        mask[b, :, :, : b % 3] = True
    return mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,groups", [(8, 2), (6, 1), (4, 4)])
def test_grouped_padded_attention_equals_megatron_s_in_values_and_gradients(dtype, heads, groups):
    grouped, megatrons = attentions(heads, groups, dtype)
    g = torch.Generator().manual_seed(heads + groups)
    seq, batch = 11, 5
    q = torch.randn(seq, batch, heads, 16, generator=g)
    k, v = torch.randn(seq, batch, groups, 16, generator=g), torch.randn(seq, batch, groups, 16, generator=g)
    out_grad = torch.randn(seq, batch, heads * 16, generator=g).to(dtype)
    mask = padded_mask(batch, seq)
    results = []
    for attention in (grouped, megatrons):
        inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = attention(*inputs, mask)
        out.backward(out_grad)
        results.append([out.float()] + [t.grad.float() for t in inputs])
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    for ours, theirs in zip(*results):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, atol=tolerance, rtol=tolerance)
    assert results[0][0].abs().sum() > 0 and results[0][2].abs().sum() > 0  # not vacuous


def test_the_local_spec_leaves_the_padded_path_to_a_vendor_s_patched_attention():
    """On NPU MindSpeed patches megatron's core attention with its flash attention: the spec keeps that path."""
    from megatron.core.models.gpt import gpt_layer_specs

    from mindspeed_rl.models.attention import VendorPaddedDotProductAttention, with_packed_attention

    def core(kind):
        spec = with_packed_attention(gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm"), kind)
        return spec.submodules.self_attention.submodules.core_attention

    assert core("cpu") is PackedDotProductAttention and core("cuda") is PackedDotProductAttention
    assert core("npu") is VendorPaddedDotProductAttention and not core("npu").grouped_padded
