"""Context parallelism and the chunked LM head at unit level: the 2 x CP chunk layout, packed rows split
per row, the chunked log-prob head against the unchunked one (values and gradients), and the refusals.
The multi-rank equivalence (CP 2 == CP 1, CP 2 x TP 2 == TP 1) is in tests/test_parallel_equivalence.py."""

import pytest
import torch

from mindspeed_rl.features.context_parallel import ring_attention_unavailable, ulysses_layout
from mindspeed_rl.models.context_parallel import rank_positions
from mindspeed_rl.models.heads import chunked_log_probs
from mindspeed_rl.models.packing import pack, trim
from tests.helpers import make_batch, single_process_world_fixture, tiny_role

single_process_world = single_process_world_fixture(seed=3)


def test_each_rank_holds_an_early_and_a_late_chunk_of_every_segment():
    # one segment of 8 over CP 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert rank_positions([8], 2, 0).tolist() == [0, 1, 6, 7]
    assert rank_positions([8], 2, 1).tolist() == [2, 3, 4, 5]
    # packed: every segment on its own (its first chunks to rank 0, whatever its length)
    assert rank_positions([4, 8], 2, 0).tolist() == [0, 3, 4, 5, 10, 11]
    every = torch.cat([rank_positions([6, 12, 18], 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(36))
    with pytest.raises(ValueError, match="does not split into 2 x CP 2"):
        rank_positions([6], 2, 0)


def test_packed_rows_are_padded_to_whole_chunks_and_labels_are_next_tokens():
    batch = make_batch(4, 11, seed=2)
    packed = pack(batch["input_ids"], batch["attention_mask"], multiple=8, row_multiple=4)
    segments = (packed.cu_seqlens[1:] - packed.cu_seqlens[:-1]).tolist()
    assert all(n % 4 == 0 for n in segments) and packed.input_ids.shape[1] % 8 == 0
    echo = packed.restore(packed.input_ids[..., None].float())[..., 0].long()
    assert torch.equal(echo, batch["input_ids"])
    # the label of each token is the next token of its own row; restore_next puts it back on that token
    nxt = packed.restore_next(packed.labels[..., None].float())[..., 0].long()
    keep = (batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).bool()
    assert torch.equal(nxt[:, 1:][keep], batch["input_ids"][:, 1:][keep])
    local = packed.split_context_parallel(2, 1)
    assert local.input_ids.shape[1] * 2 == packed.input_ids.shape[1]
    assert torch.equal(local.input_ids[0], packed.input_ids[0, local.cp_index[1]])
    padded = trim(batch["input_ids"], batch["attention_mask"], multiple=4, drop_padding_columns=False)
    assert padded.input_ids.shape[1] == 12 and padded.attention_mask.shape[-1] == 12  # widened with padding


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_log_probs_equal_the_whole_head_in_values_and_gradients(temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(
        3,
        10,
        16,
        generator=g,
    )
    weight = (
        torch.randn(
            50,
            16,
            generator=g,
        )
        * 0.3
    )
    labels = torch.randint(0, 50, (3, 10), generator=g)
    results = []
    for chunk in (0, 7, 30):  # whole, uneven chunks, exactly one chunk
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        log_p, entropy = chunked_log_probs(h, w, labels, temperature, True, chunk)
        (
            log_p.sum() * 0.5
            + (
                entropy
                * torch.linspace(
                    0,
                    1,
                    10,
                )
            ).sum()
        ).backward()
        results.append((log_p.detach(), entropy.detach(), h.grad, w.grad))
    reference = torch.log_softmax(hidden @ weight.T / temperature, -1).gather(-1, labels[..., None])[..., 0]
    assert torch.allclose(results[0][0], reference, atol=1e-5)
    for got in results[1:]:
        for a, b in zip(got, results[0]):
            assert torch.allclose(a, b, atol=1e-5)
    with torch.no_grad():  # forward only: no recomputation, same numbers
        log_p, entropy = chunked_log_probs(hidden, weight, labels, temperature, False, 4)
    assert entropy is None and torch.allclose(log_p, results[0][0], atol=1e-5)


def test_the_engine_head_gives_the_same_log_probs_for_any_chunk_size():
    from mindspeed_rl.models.engine import MegatronEngine

    batch = make_batch(4, 12, seed=5)
    outs, weights = [], None
    for chunk in (0, 5):
        engine = MegatronEngine(tiny_role(log_prob_chunk_size=chunk), trainable=False)
        weights = weights or dict(engine.named_weights())
        engine.load_weights(weights)
        outs.append(engine.forward(batch, micro_batch_size=2, with_entropy=True))
    for key in ("log_probs", "entropy"):
        assert torch.allclose(outs[0][key], outs[1][key], atol=1e-6)


def test_ulysses_head_rule_and_the_ring_on_a_device_without_it():
    assert ulysses_layout(28, 4, 4) is None  # Qwen2.5-7B at TP 1 x CP 4
    assert ulysses_layout(8, 1, 4) is None  # one query group per TP rank: repeated on every CP rank
    assert "do not split over CP 4" in ulysses_layout(14, 2, 4)  # Qwen2.5-7B at TP 2 x CP 4
    assert "neither split" in ulysses_layout(12, 3, 2)
    ring = tiny_role(context_parallel_size=2, context_parallel_algo="megatron_cp_algo").megatron
    assert "use ulysses_cp_algo" in ring_attention_unavailable(ring, "cpu")
    assert ring_attention_unavailable(ring, "npu") is None
    assert ring_attention_unavailable(tiny_role(context_parallel_size=2).megatron, "cpu") is None


def test_the_batch_plan_shows_cp_groups_and_tokens_per_rank():
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.startup.plan import batch_plan

    cfg = load_ppo_config(
        "ppo_tiny_cpu_x4", ["actor_config.context_parallel_size=2", "actor_config.log_prob_chunk_size=64"]
    )
    plan = batch_plan(cfg)
    assert "TP 2 x PP 1 x CP 2 x DP 1" in plan and "CP 0 = [0, 2], CP 1 = [1, 3]" in plan
    assert "longest sequence 64 tokens -> 32 per rank (CP 2)" in plan
    assert "log-prob head 64 tokens x V/TP 128 fp32 = 32 KiB at once (whole micro-batch: 128 KiB)" in plan


def test_the_long_context_recipe_plan_and_the_optimizer_over_dp_x_cp():
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.startup.plan import batch_plan

    plan = batch_plan(load_ppo_config("grpo_qwen25_7b_long_A3"))
    assert "16 devices = TP 1 x PP 1 x CP 4 x DP 4" in plan
    assert "longest sequence 32768 tokens -> 8192 per rank (CP 4)" in plan
    assert "log-prob head 1024 tokens x V/TP 152064 fp32 = 594 MiB at once (whole micro-batch: 4.64 GiB)" in plan
    # the distributed optimizer shards over DP x CP = 16 ranks, as over TP 4 x DP 4 in the short recipe
    assert "optimizer state about 5.32 GiB per rank" in plan
    assert "optimizer state about 5.32 GiB per rank" in batch_plan(load_ppo_config("grpo_qwen25_7b_A3"))


def test_ulysses_wraps_a_core_attention_without_megatron_s_head_size_attribute():
    """Transformer Engine's core attention keeps no ``hidden_size_per_attention_head``: the wrapper must not
    need it (CP 1 here: the all-to-alls are identities, the result is the inner attention's)."""
    from megatron.core.transformer.enums import AttnMaskType

    from mindspeed_rl.models.attention import PackedDotProductAttention, packed_seq_params
    from mindspeed_rl.models.builder import transformer_config
    from mindspeed_rl.models.context_parallel import UlyssesAttention

    class WithoutHeadSize(PackedDotProductAttention):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            del self.hidden_size_per_attention_head

    role = tiny_role()
    config = transformer_config(role.model, role.megatron)
    wrapped = type("Ulysses", (UlyssesAttention,), {"inner_class": WithoutHeadSize})(
        config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self"
    )
    plain = PackedDotProductAttention(config, 1, AttnMaskType.causal, "self")
    g = torch.Generator().manual_seed(1)
    q = torch.randn(12, 4, 16, generator=g)
    k, v = torch.randn(12, 2, 16, generator=g), torch.randn(12, 2, 16, generator=g)
    params = packed_seq_params(torch.tensor([0, 4, 12]), 8)
    assert torch.allclose(
        wrapped(q, k, v, None, packed_seq_params=params), plain(q, k, v, None, packed_seq_params=params)
    )
