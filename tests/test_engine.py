"""The megatron-core engine on one CPU process: heads, schedules, frozen models, offload."""

import math

import pytest
import torch

from mindspeed_rl.models.engine import MegatronEngine, split_micro_batches
from mindspeed_rl.models.heads import last_token_values, log_probs_and_entropy
from mindspeed_rl.models.offload import Offloader
from mindspeed_rl.models.packing import megatron_attention_mask, position_ids_from_mask
from mindspeed_rl.utils import dist
from tests.helpers import make_batch, sft_loss, single_process_world_fixture, tiny_role

single_process_world = single_process_world_fixture(seed=11)


def test_log_probs_and_entropy_match_full_softmax():
    logits = torch.randn(3, 7, 50, dtype=torch.float64).float()
    tokens = torch.randint(0, 50, (3, 7))
    for temperature in (1.0, 0.7):
        log_p, entropy = log_probs_and_entropy(logits, tokens, temperature)
        ref = torch.log_softmax(logits / temperature, dim=-1)
        assert torch.allclose(log_p, ref.gather(-1, tokens[..., None]).squeeze(-1), atol=1e-5)
        assert torch.allclose(entropy, -(ref.exp() * ref).sum(-1), atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("uses", ["both", "log_p", "entropy"])
def test_the_heads_gradient_is_autograds_of_log_softmax(temperature, uses):
    """The head's hand-written backward against autograd through torch's log_softmax (float64), in chunks and
    whole, with the loss using log p, the entropy, or both."""
    from mindspeed_rl.models.heads import chunked_log_probs

    g = torch.Generator().manual_seed(7)
    hidden, weight = torch.randn(2, 5, 12, generator=g), torch.randn(30, 12, generator=g) * 0.5
    tokens = torch.randint(0, 30, (2, 5), generator=g)
    a, b = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)

    def loss(log_p, entropy):
        return (a * log_p).sum() * (uses != "entropy") + (b * entropy).sum() * (uses != "log_p")

    h64, w64 = hidden.double().requires_grad_(True), weight.double().requires_grad_(True)
    ref = torch.log_softmax(h64 @ w64.T / temperature, -1)
    loss(ref.gather(-1, tokens[..., None])[..., 0], -(ref.exp() * ref).sum(-1)).backward()
    for chunk in (0, 4):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        log_p, entropy = chunked_log_probs(h, w, tokens, temperature, True, chunk)
        if uses == "log_p":
            (a * log_p).sum().backward()
        elif uses == "entropy":
            (b * entropy).sum().backward()
        else:
            loss(log_p, entropy).backward()
        assert torch.allclose(h.grad.double(), h64.grad, atol=1e-5), chunk
        assert torch.allclose(w.grad.double(), w64.grad, atol=1e-5), chunk


def test_last_token_values_left_and_right_padding():
    values = torch.arange(12.0).reshape(2, 6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    assert last_token_values(values, mask).tolist() == [4.0, 11.0]


def test_masks_and_positions():
    mask = torch.tensor([[0, 1, 1, 0]])
    m = megatron_attention_mask(mask)[0, 0]
    assert m.shape == (4, 4)
    assert not m[2, 1] and m[1, 2] and m[2, 0]  # causal, padded key masked
    assert not m[0, 0]  # a padded query keeps itself (finite softmax)
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 1, 1]]
    parts = split_micro_batches({"x": torch.arange(5)}, 2)
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 3], [4]]


def test_sft_loss_decreases_and_step_reports():
    engine = MegatronEngine(tiny_role(lr=3e-3), total_steps=10)
    batch = make_batch(8, 16, seed=3)
    losses = [engine.train_step(batch, sft_loss, micro_batch_size=4) for _ in range(6)]
    assert losses[-1].loss < losses[0].loss - 0.5
    assert all(r.update_successful and r.grad_norm > 0 and math.isfinite(r.grad_norm) for r in losses)
    assert losses[0].lr == pytest.approx(3e-3)


def test_padding_does_not_change_log_probs():
    engine = MegatronEngine(tiny_role(), trainable=False)
    batch = make_batch(2, 12, seed=4, left_pad=False)
    batch["attention_mask"][:] = 1
    padded = {
        "input_ids": torch.cat([torch.zeros(2, 3, dtype=torch.long), batch["input_ids"]], 1),
        "attention_mask": torch.cat([torch.zeros(2, 3, dtype=torch.long), batch["attention_mask"]], 1),
    }
    a = engine.forward(batch, 2)["log_probs"]
    b = engine.forward(padded, 2)["log_probs"][:, 3:]
    assert torch.allclose(a[:, 1:], b[:, 1:], atol=1e-5)


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
def test_lr_schedules(style):
    lr, min_lr, steps, warmup_fraction = 1e-3, 1e-4, 10, 0.2
    engine = MegatronEngine(
        tiny_role(lr=lr, min_lr=min_lr, lr_decay_style=style, lr_warmup_fraction=warmup_fraction), total_steps=steps
    )
    batch = make_batch(2, 8)
    seen = [engine.current_lr()] + [engine.train_step(batch, sft_loss, 2).lr for _ in range(steps)]
    warmup = int(warmup_fraction * steps)
    for step, value in enumerate(seen):
        if step <= warmup:
            expected = lr * step / warmup
        else:
            ratio = (step - warmup) / (steps - warmup)
            if style == "constant":
                expected = lr
            elif style == "linear":
                expected = min_lr + (lr - min_lr) * (1 - ratio)
            else:
                expected = min_lr + (lr - min_lr) * 0.5 * (math.cos(math.pi * ratio) + 1)
        assert value == pytest.approx(expected, rel=1e-6, abs=1e-12), (style, step)


def test_frozen_reference_is_never_updated():
    actor = MegatronEngine(tiny_role(lr=1e-2), total_steps=5)
    ref = MegatronEngine(tiny_role(), trainable=False)
    ref.load_weights(dict(actor.named_weights()))
    before = {k: v.clone() for k, v in ref.named_weights()}
    for _ in range(3):
        actor.train_step(make_batch(4, 10), sft_loss, 2)
    after = dict(ref.named_weights())
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert ref.optimizer is None and not ref.unwrapped().training
    assert not any(p.requires_grad for p in ref.unwrapped().parameters())
    changed = sum(not torch.equal(before[k], v) for k, v in actor.named_weights())
    assert changed > 0
    with pytest.raises(RuntimeError, match="frozen"):
        ref.train_step(make_batch(2, 8), sft_loss, 2)


@pytest.mark.parametrize("dist_opt,bf16", [(False, False), (True, False), (False, True)])
def test_offload_round_trip_is_exact_and_training_continues(dist_opt, bf16):
    batch = make_batch(4, 10, seed=5)
    engines = []
    for _ in range(2):
        dist.init_model_parallel(seed=11)
        torch.manual_seed(7)
        engines.append(MegatronEngine(tiny_role(use_distributed_optimizer=dist_opt, bf16=bf16), total_steps=5))
    a, b = engines
    b.load_weights(dict(a.named_weights()))
    for e in engines:
        e.train_step(batch, sft_loss, 2)
    off = Offloader(a)
    snapshot = {
        name: [t.clone() for t in getter()]
        for name, getter in (
            ("param", off.param_tensors),
            ("grad", off.grad_tensors),
            ("optimizer", off.optimizer_tensors),
        )
    }
    assert snapshot["optimizer"], "Adam state exists after a step"
    moved = off.offload()
    assert moved["param"] > 0 and moved["grad"] > 0 and moved["optimizer"] > 0
    assert all(t.untyped_storage().nbytes() == 0 for t in off.param_tensors())
    off.onload()
    for name, getter in (
        ("param", off.param_tensors),
        ("grad", off.grad_tensors),
        ("optimizer", off.optimizer_tensors),
    ):
        assert all(torch.equal(x, y) for x, y in zip(snapshot[name], getter())), name
    ra, rb = a.train_step(batch, sft_loss, 2), b.train_step(batch, sft_loss, 2)
    assert ra.loss == rb.loss
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a.named_weights(), b.named_weights()))


def test_value_head_engine_outputs_values():
    critic = MegatronEngine(tiny_role("critic"), head="value", value_head_init_std=0.1, total_steps=3)
    batch = make_batch(4, 10)
    out = critic.forward(batch, 2)
    assert out["values"].shape == (4, 10) and torch.all(out["values"][:, 0] == 0)
    keep = (batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).bool()  # a real token after one
    assert torch.equal(out["values"][:, 1:][keep], out["raw_values"][:, :-1][keep])
    assert torch.all(out["values"][:, 1:][~keep] == 0)  # nothing values a token that follows padding
    assert critic.unwrapped().output_layer.weight.shape == (1, 64)


@pytest.mark.parametrize(
    "recompute",
    [
        dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
        dict(recompute_granularity="selective"),
        dict(recompute_norm=True),  # megatron-core's layernorm recomputation off NPU
        dict(recompute_granularity="selective", recompute_modules=["layernorm", "mlp"]),
    ],
)
def test_activation_recompute_gives_the_same_step(recompute):
    batch = make_batch(4, 12, seed=9)
    results, initial = [], None
    for extra in ({}, recompute):
        dist.init_model_parallel(seed=11)
        engine = MegatronEngine(tiny_role(**extra), total_steps=2)
        if initial is None:
            initial = {k: v.clone() for k, v in engine.named_weights()}
        engine.load_weights(initial)
        results.append(engine.train_step(batch, sft_loss, 2))
    plain, recomputed = results
    assert recomputed.loss == pytest.approx(plain.loss, abs=1e-6)
    assert recomputed.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)


def test_device_only_flags_are_mapped_on_cpu_with_one_log_line(caplog, monkeypatch):
    """On a CPU without a C++ compiler (no torch.compile kernels either)."""
    from mindspeed_rl.accelerator import cpu
    from mindspeed_rl.compat.megatron_core import uneven_pipeline_fields
    from mindspeed_rl.config_cls import MegatronConfig
    from mindspeed_rl.models import builder
    from tests.helpers import tiny_model_config

    monkeypatch.setattr(cpu, "torch_compile_can_build", lambda: False)
    builder._LOGGED.clear()
    m = MegatronConfig(
        model="t",
        sequence_parallel=True,
        use_fused_rotary_pos_emb=True,
        use_flash_attn=True,
        use_fused_rmsnorm=True,
        tensor_model_parallel_size=1,
        num_layer_list="1,1",
        pipeline_model_parallel_size=2,
    )
    with caplog.at_level("WARNING"):
        cfg = builder.transformer_config(tiny_model_config(), m, "cpu")
        builder.transformer_config(tiny_model_config(), m, "cpu")
    assert not cfg.sequence_parallel and not cfg.apply_rope_fusion and not cfg.gradient_accumulation_fusion
    assert cfg.use_cpu_initialization
    text = caplog.text
    for flag in ("use_fused_rotary_pos_emb", "use_flash_attn", "use_fused_rmsnorm"):
        assert text.count(flag) == 1, flag
    fields = uneven_pipeline_fields(m.layers_per_stage(2))
    if "pipeline_model_parallel_layout" in fields:  # megatron-core >= 0.13
        assert fields == {"pipeline_model_parallel_layout": "Et*1|t*1L"}
        assert cfg.pipeline_model_parallel_layout is not None
    else:
        assert fields == {"num_layers_in_first_pipeline_stage": 1} and cfg.num_layers_in_first_pipeline_stage == 1


@pytest.mark.parametrize("dist_opt,bf16", [(False, False), (True, False), (True, True)])
def test_engine_save_load_resumes_the_same_trajectory(tmp_path, dist_opt, bf16):
    """Bit-identical next step; with bf16 + the distributed optimizer the fp32 main weights come back too
    (not rebuilt from the bf16 weights)."""
    from mindspeed_rl.checkpoint import megatron_layout as ml
    from mindspeed_rl.checkpoint.engine_io import load_engine, save_engine

    batch = make_batch(4, 10, seed=8)
    dist.init_model_parallel(seed=11)
    a = MegatronEngine(tiny_role(use_distributed_optimizer=dist_opt, bf16=bf16, lr=1e-2), total_steps=6)
    a.train_step(batch, sft_loss, 2)
    save_engine(a, str(tmp_path), iteration=1, extra={"consumed_samples": 4})
    assert ml.read_tracker(str(tmp_path)) == 1
    torch.manual_seed(123)
    noise_after_save = torch.rand(3)
    next_a = a.train_step(batch, sft_loss, 2)
    b = MegatronEngine(tiny_role(use_distributed_optimizer=dist_opt, bf16=bf16, lr=1e-2), total_steps=6)
    payload = load_engine(b, str(tmp_path))
    assert payload["iteration"] == 1 and payload["consumed_samples"] == 4
    next_b = b.train_step(batch, sft_loss, 2)
    assert next_b.loss == next_a.loss and next_b.lr == next_a.lr
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a.named_weights(), b.named_weights()))
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), noise_after_save)


@pytest.mark.parametrize("lora", [False, True])
def test_the_reference_holds_the_starting_policy_while_it_trains(lora):
    """workers/reference.py, the one reference of PPO's actor and the DPO stage: an engine of its own parked on
    host between forwards, or with LoRA the policy itself with its adapters off."""
    from mindspeed_rl.workers.reference import ReferencePolicy

    role = tiny_role(lr=1e-2, **(dict(lora_r=4, lora_alpha=8.0) if lora else {}))
    batch = make_batch(4, 10, seed=3)
    policy = MegatronEngine(role, total_steps=5)
    reference = ReferencePolicy(role, policy, remove_padding=False, park_on_host=True)
    start = policy.forward(batch, 2)["log_probs"]
    reference.load(reference.initial_weights(), origin=None)
    for _ in range(2):
        policy.train_step(batch, sft_loss, 2)
    assert not torch.allclose(policy.forward(batch, 2)["log_probs"], start)
    with reference.in_use() as (engine, timing):
        held = engine.forward(batch, 2)["log_probs"]
    assert torch.allclose(held, start, atol=1e-6)
    assert (engine is policy) == lora and (reference.engine is None) == lora
    assert set(timing) == (set() if lora else {"timing/ref_onload", "timing/ref_offload"})
    assert not torch.allclose(policy.forward(batch, 2)["log_probs"], start)  # the adapters are back on


@pytest.mark.parametrize("dist_opt,bf16", [(False, False), (True, True)])
def test_adam_steps_with_torchs_fused_kernel_on_cpu_to_the_same_weights(monkeypatch, dist_opt, bf16):
    """On CPU megatron-core's torch AdamW steps with torch's fused kernel (one pass per tensor instead of an op per
    term), also once param groups loaded from a checkpoint (fused unset) replaced the built ones; the weights after
    three steps are those of torch's per-tensor step up to rounding."""
    from mindspeed_rl.accelerator import get_accelerator
    from mindspeed_rl.checkpoint.optimizer_state import sub_optimizers

    batch = make_batch(4, 12, seed=5)
    weights, flags = [], []
    for fused in (False, True):
        monkeypatch.setattr(type(get_accelerator()), "fused_adam", fused)
        dist.init_model_parallel(seed=11)
        engine = MegatronEngine(tiny_role(use_distributed_optimizer=dist_opt, bf16=bf16, lr=1e-2), total_steps=5)
        if weights:
            engine.load_weights(weights[0][0])
        start = {k: v.clone() for k, v in engine.named_weights()}
        for step in range(3):
            if step == 1:  # what a loaded checkpoint's param groups carry
                for sub in sub_optimizers(engine.optimizer):
                    for group in sub.optimizer.param_groups:
                        group["fused"] = None
            engine.train_step(batch, sft_loss, 2)
        flags.append({g["fused"] for sub in sub_optimizers(engine.optimizer) for g in sub.optimizer.param_groups})
        weights.append((start, {k: v.clone() for k, v in engine.named_weights()}))
    assert flags == [{None}, {True}]
    (_, per_tensor), (_, fused) = weights
    moved = max((per_tensor[k].float() - weights[0][0][k].float()).abs().max().item() for k in per_tensor)
    assert moved > 1e-3  # the steps did train
    if bf16:  # fp32 main weights a rounding apart (7e-6 of 0.03) can round to neighbouring bf16 values: rarely
        flips = [(per_tensor[k] != fused[k]) for k in per_tensor]
        assert sum(int(f.sum()) for f in flips) <= 1e-3 * sum(f.numel() for f in flips)
        for k in per_tensor:  # one bf16 step, or near zero the main weights' own rounding
            a, b = per_tensor[k].float(), fused[k].float()
            step = torch.finfo(torch.bfloat16).eps * torch.maximum(a.abs(), b.abs()) + 1e-6 * moved
            assert ((a - b).abs() <= step).all(), k
        return
    worst = max((per_tensor[k].float() - fused[k].float()).abs().max().item() for k in per_tensor)
    assert worst <= 1e-3 * moved, worst  # rounding: 7e-6 of 0.03 here
