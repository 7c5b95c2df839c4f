"""Qwen3-Next's hybrid decoder in megatron-core's local spec: Gated DeltaNet linear attention in three of every four
layers, gated full attention in the fourth, norms whose weights are stored zero-centred.

Gated DeltaNet (one layer; value head h reads key head g(h); ``[q; k; v; z] = in_proj_qkvz(x)``,
``[b; a] = in_proj_ba(x)``):

    [q; k; v] = silu(causal_conv1d([q; k; v]))          one depthwise filter per channel, width linear_conv_kernel_dim
    q, k = q / |q|, k / |k|
    beta_t = sigmoid(b_t),   g_t = -exp(A_log) * softplus(a_t + dt_bias)
    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T       the gated delta rule, S_0 = 0
    o_t = S_t^T q_t / sqrt(d_k)
    y = out_proj(rmsnorm(o) * w * silu(z))

computed chunk by chunk with megatron-core's torch reference of the rule (``torch_chunk_gated_delta_rule``: its
CUDA path needs flash-linear-attention's Triton kernels). Padded positions are zeroed before the recurrence (as
transformers does), so left padding leaves the state at 0; packed rows run one by one (the state restarts per row).

Tensor parallelism: a rank holds whole key-head groups. ``in_proj_qkvz`` keeps the checkpoint's rows, grouped per key
head ``[q_g; k_g; v_g; z_g]``, ``in_proj_ba`` likewise ``[b_g; a_g]``, and ``conv1d`` is stored grouped the same way
``[q_g; k_g; v_g]`` (the family map reorders the checkpoint's ``[q; k; v]``), so every split is a contiguous chunk;
``dt_bias`` and ``A_log`` split by value head; ``out_proj`` is row-parallel; the gated norm's weight is replicated
and its gradient summed over the TP group.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule


class ZeroCenteredRMSNorm(torch.nn.Module):
    """RMSNorm whose weight w is stored zero-centred: y = x / rms(x) * (1 + w), computed in fp32 (Qwen3-Next)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        setattr(self.weight, "sequence_parallel", config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(torch.nn.Module):
    """y = rmsnorm(x) * w * silu(gate) over the last dimension (one value head); w's gradient summed over TP."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, tp_group):
        super().__init__()
        self.eps, self.tp_group = eps, tp_group
        self.weight = torch.nn.Parameter(torch.ones(size, dtype=dtype))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

        dtype = x.dtype
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = copy_to_tensor_model_parallel_region(self.weight, group=self.tp_group)  # all-reduce backward
        return (weight * y.to(dtype) * F.silu(gate.float())).to(dtype)


class GatedDeltaNetAttention(MegatronModule):
    """The token mixer of a linear-attention layer, in the place of a TransformerLayer's ``self_attention``."""

    def __init__(self, config, pg_collection=None, **_):
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        super().__init__(config=config)
        tp_group = pg_collection.tp if pg_collection is not None else ps.get_tensor_model_parallel_group()
        tp = tp_group.size()
        if config.linear_num_key_heads % tp or config.linear_num_value_heads % config.linear_num_key_heads:
            raise ValueError(
                f"linear_num_key_heads {config.linear_num_key_heads} must split whole over TP {tp} and divide "
                f"linear_num_value_heads {config.linear_num_value_heads}"
            )
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.ratio = config.linear_num_value_heads // config.linear_num_key_heads
        self.groups = config.linear_num_key_heads // tp  # this rank's key heads
        key, value = config.linear_key_head_dim * config.linear_num_key_heads, self.dv * config.linear_num_value_heads
        linear = dict(config=config, init_method=config.init_method, bias=False, skip_bias_add=True, tp_group=tp_group)
        self.in_proj_qkvz = ColumnParallelLinear(config.hidden_size, 2 * key + 2 * value, gather_output=False, **linear)
        self.in_proj_ba = ColumnParallelLinear(
            config.hidden_size, 2 * config.linear_num_value_heads, gather_output=False, **linear
        )
        channels = (2 * key + value) // tp
        self.kernel = config.linear_conv_kernel_dim
        self.conv1d = torch.nn.Conv1d(
            channels, channels, self.kernel, groups=channels, bias=False, dtype=config.params_dtype
        )
        heads = self.groups * self.ratio
        self.dt_bias = torch.nn.Parameter(torch.ones(heads, dtype=config.params_dtype))
        self.A_log = torch.nn.Parameter(torch.empty(heads, dtype=config.params_dtype).uniform_(1, 16).log())
        for param in (self.conv1d.weight, self.dt_bias, self.A_log):
            set_tensor_model_parallel_attributes(param, True, 0, 1)
        self.out_norm = GatedRMSNorm(self.dv, config.layernorm_epsilon, config.params_dtype, tp_group)
        self.out_proj = RowParallelLinear(
            value,
            config.hidden_size,
            input_is_parallel=True,
            **{**linear, "init_method": config.output_layer_init_method},
        )

    def forward(self, hidden_states, attention_mask, packed_seq_params=None, **_):
        """[s, b, hidden] -> ([s, b, hidden], None); ``attention_mask``: megatron's [b, 1, s, s] (True = masked)."""
        qkvz, _ = self.in_proj_qkvz(hidden_states)  # [s, b, local]: every position (sequence parallel gathered)
        ba, _ = self.in_proj_ba(hidden_states)
        if attention_mask is not None and packed_seq_params is None:
            real = real_positions(attention_mask).t()[..., None].to(qkvz.dtype)  # [s, b, 1]
            qkvz, ba = qkvz * real, ba * real
        if packed_seq_params is None:
            out = self._mix(qkvz, ba)
        else:
            bounds = packed_seq_params.cu_seqlens_q.tolist()
            sizes = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
            sizes += [qkvz.shape[0] - bounds[-1]] if qkvz.shape[0] > bounds[-1] else []
            rows = zip(qkvz.split(sizes), ba.split(sizes))
            out = torch.cat([self._mix(q, b) for q, b in rows if q.shape[0]])
        return self.out_proj(out)

    def _mix(self, qkvz: torch.Tensor, ba: torch.Tensor) -> torch.Tensor:
        """The conv, the gated delta rule and the gated norm of one padded batch or one packed row -> [s, b, v]."""
        from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule

        s, b = qkvz.shape[:2]
        groups, r, dk, dv = self.groups, self.ratio, self.dk, self.dv
        mixed, z = qkvz.view(s, b, groups, 2 * dk + 2 * r * dv).split([2 * dk + r * dv, r * dv], dim=-1)
        x = mixed.reshape(s, b, -1).permute(1, 2, 0)  # [b, channels, s], channels grouped per key head
        x = F.silu(F.conv1d(F.pad(x, (self.kernel - 1, 0)), self.conv1d.weight, groups=x.shape[1]))
        q, k, v = x.permute(2, 0, 1).reshape(s, b, groups, -1).split([dk, dk, r * dv], dim=-1)
        # normalised in fp32 (the rule computes in fp32), then one copy per value head
        q, k = (l2norm(t.float()).repeat_interleave(r, dim=2) for t in (q, k))
        v = v.reshape(s, b, groups * r, dv)
        beta_raw, a = ba.view(s, b, groups, 2 * r).split([r, r], dim=-1)
        beta = beta_raw.reshape(s, b, -1).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.reshape(s, b, -1).float() + self.dt_bias)
        batch_first = (t.transpose(0, 1) for t in (q, k, v, g, beta))
        out, _ = torch_chunk_gated_delta_rule(*batch_first, use_qk_l2norm_in_kernel=False)
        out = self.out_norm(out.transpose(0, 1).to(v.dtype), z.reshape(s, b, groups * r, dv))
        return out.reshape(s, b, -1)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the head dimension (flash-linear-attention's and transformers' form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def real_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """[b, s] True at real tokens, from the engine's [b, 1, s, s] mask (models/packing.megatron_attention_mask: True =
    masked; causal and key padding, the diagonal kept): the keys the last query may see. The last position always
    counts as real: a right pad there reaches no earlier position."""
    return ~attention_mask[:, 0, -1, :]


def hybrid_block_spec(model, config, stage=None, transformer_engine: bool = False):
    """The block spec of this pipeline stage: every ``linear_attention_freq``-th layer gated full attention (q/k norms
    zero-centred), the others :class:`GatedDeltaNetAttention`, each with megatron's dense or MoE MLP; all norms
    :class:`ZeroCenteredRMSNorm`. ``stage``: the virtual-stage arguments (``vp_stage``). Local modules on every
    device (``transformer_engine`` is not used): the layer spec of the Gated DeltaNet families."""
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from .attention import with_packed_attention

    layers = []
    for i, spec in enumerate(gpt_layer_specs.get_gpt_decoder_layer_specs(config, False, "RMSNorm")):
        spec = with_packed_attention(copy.deepcopy(spec))
        spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = ZeroCenteredRMSNorm
        attention = spec.submodules.self_attention.submodules
        if model.is_linear_attention_layer(i):
            spec.submodules.self_attention = ModuleSpec(module=GatedDeltaNetAttention)
        else:
            attention.q_layernorm = attention.k_layernorm = ZeroCenteredRMSNorm
        layers.append(spec)
    stage = stage or {}
    if config.pipeline_model_parallel_layout is not None:
        from megatron.core.transformer.enums import LayerType

        ids = config.pipeline_model_parallel_layout.get_layer_id_list(layer_type=LayerType.decoder, **stage)
        local = [layers[i] for i in ids]
    else:
        offset = get_transformer_layer_offset(config, **stage)
        local = layers[offset : offset + get_num_layers_to_build(config, **stage)]
    return TransformerBlockSubmodules(layer_specs=local, layer_norm=ZeroCenteredRMSNorm)


__all__ = ["GatedDeltaNetAttention", "ZeroCenteredRMSNorm", "hybrid_block_spec"]
