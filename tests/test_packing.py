"""Remove padding and token-budget micro-batches: the same log-probs, values, losses and gradients as the
padded path (fp32, within 1e-5), whatever the split."""

import numpy as np
import pytest
import torch

from mindspeed_rl.models.engine import MegatronEngine
from mindspeed_rl.models.packing import balanced_split, pack, token_budget_groups, trim
from tests.helpers import single_process_world_fixture, tiny_role

single_process_world = single_process_world_fixture(seed=11)


def rl_batch(rows=6, prompt=7, response=9, seed=0):
    """Left-padded prompts and right-padded responses of very different lengths (as rollouts give)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (rows, prompt + response), generator=g)
    mask = torch.zeros(rows, prompt + response, dtype=torch.long)
    for b in range(rows):
        p_len, r_len = 2 + (b * 3) % (prompt - 1), 1 + (b * 5) % response
        mask[b, prompt - p_len : prompt + r_len] = 1
    ids = ids * mask
    response_mask = mask.clone()
    response_mask[:, :prompt] = 0
    return {"input_ids": ids, "attention_mask": mask, "response_mask": response_mask}


def token_loss(outputs, mb, total_tokens):
    """Token-mean NLL over response tokens, normalised by the whole mini-batch's count (LossScale)."""
    mask = mb["response_mask"].float()
    key = "log_probs" if "log_probs" in outputs else "values"
    value = outputs[key] if key == "log_probs" else outputs[key] ** 2
    loss = -(value * mask).sum() / total_tokens
    return loss, {"loss_share": float(loss)}


def clone_engine(source, head, remove_padding):
    engine = MegatronEngine(
        tiny_role(lr=1e-2), head=head, trainable=True, total_steps=10, remove_padding=remove_padding
    )
    engine.load_weights(dict(source.named_weights()))
    return engine


def test_pack_and_trim_keep_rows_apart_and_restore_the_grid():
    batch = rl_batch()
    packed = pack(batch["input_ids"], batch["attention_mask"], multiple=4)
    lengths = batch["attention_mask"].sum(1)
    total = int(lengths.sum())
    assert packed.input_ids.shape == (1, -(-total // 4) * 4) and packed.attention_mask is None
    # one segment per row (plus the filler up to a multiple of 4), positions restart per row
    assert packed.cu_seqlens.tolist()[:7] == [0] + torch.cumsum(lengths, 0).tolist()
    assert packed.cu_seqlens[-1] == packed.input_ids.shape[1] and packed.max_seqlen == int(lengths.max())
    assert int((packed.position_ids[0, :total] == 0).sum()) == 6
    echo = packed.restore(packed.input_ids[..., None].float())[..., 0]
    assert torch.equal(echo.long(), batch["input_ids"])
    trimmed = trim(batch["input_ids"][2:4], batch["attention_mask"][2:4])
    assert trimmed.input_ids.shape[1] < batch["input_ids"].shape[1]
    assert torch.equal(trimmed.restore(trimmed.input_ids[..., None].float())[..., 0].long(), batch["input_ids"][2:4])


@pytest.mark.parametrize("remove_padding,budget", [(True, None), (False, 40), (True, 40)])
def test_forward_equals_the_padded_path(remove_padding, budget):
    batch = rl_batch()
    base = MegatronEngine(tiny_role(), head="lm", trainable=False)
    want = base.forward(batch, micro_batch_size=2, with_entropy=True)
    base.remove_padding = remove_padding
    got = base.forward(batch, micro_batch_size=2, with_entropy=True, token_budget=budget)
    # every position whose predecessor is a real token of the same row
    keep = batch["attention_mask"][:, 1:].bool() & batch["attention_mask"][:, :-1].bool()
    for key in ("log_probs", "entropy"):
        assert torch.allclose(got[key][:, 1:][keep], want[key][:, 1:][keep], atol=1e-5), key
    critic = MegatronEngine(tiny_role("critic"), head="value", trainable=False)
    values = critic.forward(batch, micro_batch_size=3)["values"]
    critic.remove_padding = remove_padding
    packed_values = critic.forward(batch, micro_batch_size=3, token_budget=budget)["values"]
    assert torch.allclose(packed_values[:, 1:][keep], values[:, 1:][keep], atol=1e-5)


@pytest.mark.parametrize("head", ["lm", "value"])
def test_train_step_loss_and_weights_are_independent_of_the_split(head):
    batch = rl_batch(rows=8)
    total = float(batch["response_mask"].sum())
    source = MegatronEngine(tiny_role(), head=head, trainable=False)
    results = {}
    for name, remove_padding, micro, budget in (
        ("padded", False, 8, None),
        ("padded micro 2", False, 2, None),
        ("budget 30", False, 8, 30),
        ("packed", True, 3, None),
        ("packed budget 25", True, 8, 25),
    ):
        engine = clone_engine(source, head, remove_padding)
        step = engine.train_step(batch, lambda o, mb: token_loss(o, mb, total), micro, token_budget=budget)
        grads = {n: p.main_grad.clone() for n, p in engine.unwrapped().named_parameters()}
        results[name] = (step.metrics["loss_share"], step.grad_norm, grads)
    loss, grad_norm, grads = results["padded"]
    for name, (other_loss, other_norm, other_grads) in results.items():
        assert other_loss == pytest.approx(loss, abs=1e-5), name
        assert other_norm == pytest.approx(grad_norm, rel=1e-4), name
        for key, grad in grads.items():  # the gradient itself (Adam's first step would amplify rounding)
            assert torch.allclose(other_grads[key], grad, atol=1e-6, rtol=1e-4), (name, key)


def test_token_budget_groups_fit_the_budget_and_cover_every_row_once():
    lengths = [5, 100, 7, 60, 60, 3, 250, 9]
    for packed in (True, False):
        groups = token_budget_groups(lengths, 128, packed)
        assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))
        for g in groups:
            cost = sum(lengths[i] for i in g) if packed else len(g) * max(lengths[i] for i in g)
            assert cost <= 128 or len(g) == 1  # the 250-token row gets a micro-batch of its own
    assert len(token_budget_groups(lengths, 128, packed=True)) < len(token_budget_groups(lengths, 128, packed=False))


def test_balanced_split_equal_counts_near_equal_tokens():
    lengths = [256, 8, 200, 16, 180, 12, 150, 30]
    shares = balanced_split(lengths, 2)
    assert [len(s) for s in shares] == [4, 4]
    assert sorted(np.concatenate(shares).tolist()) == list(range(8))
    sums = [sum(lengths[i] for i in s) for s in shares]
    contiguous = [sum(lengths[:4]), sum(lengths[4:])]
    assert abs(sums[0] - sums[1]) <= abs(contiguous[0] - contiguous[1]) and abs(sums[0] - sums[1]) <= 30
