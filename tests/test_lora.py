"""LoRA adapters on megatron-core's parallel linear layers: the formula, the merged weights, the off switch."""

import pytest
import torch

from mindspeed_rl.models.lora import adapter_parameters, adapters_disabled, apply_lora, merged_weight_sources
from tests.helpers import single_process_world_fixture, tiny_family_model, tiny_role

single_process_world = single_process_world_fixture(seed=11)


def randomize_adapters(engine, seed: int = 5) -> None:
    """B ~ N(0, 0.05^2) on every adapter, so the adapters change the model (B starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in engine.unwrapped().named_parameters():
            if name.endswith("lora_B"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def _layers():
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True,
                               params_dtype=torch.float32)  # fmt: skip
    init = torch.nn.init.normal_
    model = torch.nn.Module()
    model.linear_qkv = ColumnParallelLinear(16, 24, config=config, init_method=init, bias=True, gather_output=False)
    model.linear_proj = RowParallelLinear(24, 16, config=config, init_method=init, bias=False,
                                          input_is_parallel=True, skip_bias_add=True)  # fmt: skip
    return model


@pytest.mark.parametrize("kind", ["linear_qkv", "linear_proj"])
def test_adapted_layer_is_the_lora_formula_with_its_gradients(kind):
    """y = x W^T + b + (alpha / r) x A^T B^T, and autograd of that formula gives A's and B's gradients."""
    torch.manual_seed(0)
    model = _layers()
    state = apply_lora(model, r=4, alpha=8.0, targets=[kind])
    layer = getattr(model, kind)
    with torch.no_grad():
        layer.lora_B.normal_()
    assert set(adapter_parameters(model)) == {f"{kind}.lora_A", f"{kind}.lora_B"}
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [f"{kind}.lora_A", f"{kind}.lora_B"]
    x = torch.randn(5, 3, layer.weight.shape[1])
    out, bias = layer(x)
    a, b = layer.lora_A.detach().clone().requires_grad_(), layer.lora_B.detach().clone().requires_grad_()
    want = x @ layer.weight.T + 2.0 * (x @ a.T) @ b.T
    if bias is None and layer.bias is not None:
        want = want + layer.bias
    assert torch.allclose(out, want, atol=1e-5)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    (want * upstream).sum().backward()
    assert torch.allclose(layer.lora_A.grad, a.grad, atol=1e-4) and torch.allclose(layer.lora_B.grad, b.grad, atol=1e-4)
    assert layer.weight.grad is None  # frozen
    with adapters_disabled(state):
        base, _ = layer(x)
    assert torch.allclose(base + 2.0 * (x @ a.T) @ b.T, out, atol=1e-5) and state.enabled
    merged = {name: make() for name, make in merged_weight_sources(model, state).items()}
    assert f"{kind}.lora_A" not in merged and f"{kind}.lora_B" not in merged
    assert torch.allclose(merged[f"{kind}.weight"], layer.weight + 2.0 * b @ a, atol=1e-6)


def test_unknown_targets_and_a_model_without_them_are_refused():
    with pytest.raises(ValueError, match="not among"):
        apply_lora(_layers(), r=2, alpha=2.0, targets=["q_proj"])
    with pytest.raises(ValueError, match="nothing to adapt"):
        apply_lora(torch.nn.Linear(2, 2), r=2, alpha=2.0)


def test_a_lora_engine_trains_only_its_adapters_and_exports_merged_weights(tmp_path):
    """Engine with lora_r: the optimizer holds the adapters only; after a step the base weights are unchanged,
    the exported weights are base + (alpha / r) B A and give the adapted model's log-probs; the reference
    (adapters off) gives the base model's; a checkpoint folds into plain weights for HF and resharding."""
    from mindspeed_rl.checkpoint.engine_io import save_engine
    from mindspeed_rl.checkpoint.megatron_reader import iter_mg_stages
    from mindspeed_rl.checkpoint.optimizer_state import engine_slots
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch, sft_loss, tiny_role

    dist.init_model_parallel(seed=11)
    base = MegatronEngine(tiny_role(), trainable=False)
    role = tiny_role(lora_r=4, lora_alpha=8.0, lr=1e-2)
    engine = MegatronEngine(role, total_steps=4)
    engine.load_weights(dict(base.named_weights()))  # a base checkpoint: the adapters keep their init
    trained = {s.name for sub in engine_slots(engine) for s in sub}
    assert trained and all(n.endswith((".lora_A", ".lora_B")) for n in trained)
    assert len(trained) == 2 * 4 * 2  # 2 layers x 4 target layers x (A, B)
    batch = make_batch(4, 12, seed=3)
    before = dict(base.named_weights())
    engine.train_step(batch, sft_loss, 2)
    weights = dict(engine.named_weights())
    assert all(torch.equal(weights[n], t) for n, t in before.items())  # the base did not move
    exported = dict(engine.export_weights())
    assert set(exported) == set(before)
    merged = MegatronEngine(tiny_role(), trainable=False)
    merged.load_weights(exported)
    assert not torch.equal(
        exported["decoder.layers.0.self_attention.linear_qkv.weight"],
        before["decoder.layers.0.self_attention.linear_qkv.weight"],
    )
    adapted = engine.forward(batch, 2)["log_probs"]
    assert torch.allclose(merged.forward(batch, 2)["log_probs"], adapted, atol=1e-5)
    with adapters_disabled(engine.lora):
        assert torch.allclose(engine.forward(batch, 2)["log_probs"], base.forward(batch, 2)["log_probs"], atol=1e-6)
    save_engine(engine, str(tmp_path), 1)
    folded = dict(next(iter_mg_stages(str(tmp_path)))[1])
    assert all(torch.allclose(folded[n], exported[n], atol=1e-6) for n in exported)
    assert not any(n.endswith(".lora_A") for n in folded)
    # the rollout's weight stream merges piece by piece (embedding, each layer, final): never the whole rank
    from unittest import mock

    from mindspeed_rl.models import lora
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights

    with mock.patch.object(lora, "merge", wraps=lora.merge) as merges:
        streamed, counts = {}, []
        for piece in iter_full_weights(engine):
            streamed.update(piece)
            counts.append(merges.call_count)
    assert counts == [0, 4, 8, 8] and all(torch.equal(streamed[n], exported[n]) for n in exported)


@pytest.mark.parametrize("family", ["dense", "qwen3_moe"])
def test_lora_at_every_layout_equals_one_rank(tmp_path, family):
    """Adapters (on every expert too, for MoE) at TP 2, PP 2 and CP 2 (dense) and EP 2 (MoE), loaded from the
    converter's reshard of one LoRA checkpoint: the same log-probs and, after one SFT step, the same merged
    model (read back from each layout's adapter-only checkpoint) as on one rank, fp32 within 1e-5."""
    import dataclasses
    import os

    from mindspeed_rl.checkpoint.engine_io import save_engine
    from mindspeed_rl.checkpoint.megatron_reader import iter_mg_stages
    from mindspeed_rl.checkpoint.reshard import mg_to_mg
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests import parallel_worker

    model = tiny_family_model(family) if family != "dense" else tiny_role().model
    megatron = dict(lora_r=4, lora_alpha=8.0, lr=1e-2)
    dist.init_model_parallel(seed=11)
    engine = MegatronEngine(tiny_role(model=model, **megatron), total_steps=4)
    randomize_adapters(engine)
    save_engine(engine, str(tmp_path / "src"), 1)
    start = dict(iter_mg_stages(str(tmp_path / "src")))[0]
    # (MoE at TP > 1 trains only with sequence parallelism, which megatron's torch norms refuse on CPU: the
    # expert layers' TP path is checked layer by layer in test_lora_layers_under_tensor_sequence_and_expert...)
    layouts = (
        [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 1, 2)] if family == "dense" else [(1, 1, 1, 1), (1, 1, 2, 1)]
    )
    specs = {}
    for tp, pp, ep, cp in layouts:
        tag = f"tp{tp}pp{pp}ep{ep}cp{cp}"
        mg_to_mg(str(tmp_path / "src"), str(tmp_path / f"load_{tag}"), tp, pp, ep=ep, weights_only=True)
        specs[tag] = dict(tp=tp, pp=pp, ep=ep, cp=cp, model=dataclasses.asdict(model), megatron=megatron,
                          load=f"load_{tag}", save=f"trained_{tag}", world=tp * pp * ep * cp)  # fmt: skip
    reference = next(tag for tag, spec in specs.items() if spec["world"] == 1)  # in this process
    logps = {reference: parallel_worker.lora_step(specs[reference], str(tmp_path))}
    # the other layouts: one spawn per world size, its layouts one after another
    parallel_worker.spawn_layouts("run_lora", [spec for spec in specs.values() if spec["world"] > 1], tmp_path)
    results = {}
    for tag in specs:
        if tag not in logps:
            logps[tag] = torch.load(os.path.join(tmp_path, f"trained_{tag}.pt"))["log_probs"]
        merged = {k: v for _, stage in iter_mg_stages(str(tmp_path / f"trained_{tag}")) for k, v in stage.items()}
        results[tag] = logps[tag], merged
    (ref_logp, ref), *others = results.values()
    for tag, (log_probs, merged) in list(results.items())[1:]:
        assert torch.allclose(ref_logp, log_probs, atol=1e-5), tag
        worst = max((ref[k] - merged[k]).abs().max().item() for k in ref)
        assert merged.keys() == ref.keys() and worst <= 1e-5, (tag, worst)
    moved = {k: (ref[k] - start[k]).abs().max().item() for k in ref}
    assert min(v for k, v in moved.items() if "linear_fc1" in k) > 1e-3  # every expert (or the MLP) trained
    assert max(v for k, v in moved.items() if "norm" in k or "embedding" in k) == 0  # the base did not


def test_lora_layers_under_tensor_sequence_and_expert_parallelism(tmp_path):
    """A column- then a row-parallel LoRA layer at TP 2, as plain TP, with sequence parallelism, and as expert
    layers (their TP communication left to the dispatcher): the output and every adapter gradient equal the
    plain-torch formula's on one rank (fp32, 1e-5), and replicated factors agree across the ranks."""
    import os

    from tests import parallel_worker

    parallel_worker.spawn("run_lora_layers", 2, {}, tmp_path)
    results = torch.load(os.path.join(tmp_path, "lora_layers.pt"))
    ref = results.pop("reference")
    assert set(results) == {"tp", "sequence_parallel", "expert"}
    for case, got in results.items():
        assert got["replicas_agree"], case
        for key in ("out", "a1", "b1", "a2", "b2"):
            assert torch.allclose(got[key], ref[key], atol=1e-5), (case, key, (got[key] - ref[key]).abs().max())


def test_a_lora_critic_trains_its_value_head_with_the_adapters():
    from mindspeed_rl.checkpoint.optimizer_state import engine_slots
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist

    dist.init_model_parallel(seed=11)
    critic = MegatronEngine(tiny_role("critic", lora_r=2), head="value", value_head_init_std=0.1, total_steps=2)
    trained = {s.name for sub in engine_slots(critic) for s in sub}
    assert "output_layer.weight" in trained and all(
        n.endswith(("lora_A", "lora_B")) for n in trained - {"output_layer.weight"}
    )


def test_the_plan_counts_the_adapters_the_engine_builds():
    """The dry-run plan's LoRA count (ModelConfig.lora_parameter_count) equals the adapters of a real engine."""
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.trainer.startup.plan import trainable_memory
    from mindspeed_rl.utils import dist

    dist.init_model_parallel(seed=11)
    role = tiny_role(lora_r=4, lora_target_modules=["linear_qkv", "linear_fc2"])
    engine = MegatronEngine(role, total_steps=2)
    built = sum(p.numel() for p in adapter_parameters(engine.unwrapped()).values())
    total, per_rank = role.model.lora_parameter_count(4, ["linear_qkv", "linear_fc2"], tp=1)
    assert built == total == per_rank
    half_a, half_b = role.model.lora_parameter_count(4, ["linear_qkv", "linear_fc2"], tp=2)
    assert half_a == total and total / 2 < half_b < total
    assert "LoRA r=4 on linear_qkv, linear_fc2" in trainable_memory(role)
    assert role.model.lora_parameter_count(4, ["linear_qkv"], layers_per_rank=1)[1] * 2 == built_of(engine, "qkv")
    # MoE: every expert's linear_fc1 / linear_fc2 gets adapters
    moe = tiny_role(model=tiny_family_model("qwen3_moe"), lora_r=4)
    engine = MegatronEngine(moe, total_steps=2)
    adapters = adapter_parameters(engine.unwrapped())
    experts = {n: p for n, p in adapters.items() if ".local_experts." in n}
    assert len(experts) == 2 * 2 * moe.model.num_experts * 2  # layers x (fc1, fc2) x experts x (A, B)
    params = dict(engine.unwrapped().named_parameters())  # reduced like their expert's weight (EP > 1: not over DP)
    assert all(p.allreduce == params[n.rsplit(".", 1)[0] + ".weight"].allreduce for n, p in experts.items())
    total, per_rank = moe.model.lora_parameter_count(4, moe.megatron.lora_target_modules)
    assert sum(p.numel() for p in adapters.values()) == total == per_rank
    assert moe.model.lora_parameter_count(4, ["linear_fc1", "linear_fc2"], ep=2)[1] * 2 == built_of(engine, "experts")


def test_a_rank_above_a_target_layers_smaller_dimension_is_refused():
    """lora_r is bounded by min(in, out) of the un-sharded weight of every target, expert layers included."""
    from mindspeed_rl.config_cls import ConfigError
    from mindspeed_rl.features.lora import check_rank as check_lora_rank

    dense = tiny_family_model("qwen25")  # hidden 256: every dense target allows 256
    check_lora_rank(tiny_role(model=dense, lora_r=256))
    for r in (257, 4096, 100000):
        with pytest.raises(ConfigError, match=rf"actor_config.lora_r: {r} exceeds .* linear_qkv .*at most 256"):
            check_lora_rank(tiny_role(model=dense, lora_r=r))
    moe = tiny_family_model("qwen3_moe")  # expert MLP 128 < hidden 256
    check_lora_rank(tiny_role(model=moe, lora_r=128))
    check_lora_rank(tiny_role(model=moe, lora_r=256, lora_target_modules=["linear_qkv", "linear_proj"]))
    with pytest.raises(ConfigError, match=r"129 exceeds .* linear_fc2 of each expert .*\[out 256, in 128\]"):
        check_lora_rank(tiny_role(name="critic", model=moe, lora_r=129))


def built_of(engine, part: str) -> int:
    """Adapter parameters of the engine whose name holds ``part``."""
    return sum(p.numel() for n, p in adapter_parameters(engine.unwrapped()).items() if part in n)


def test_a_lora_checkpoint_resumes_the_same_step(tmp_path):
    """Save after a step, load into a fresh LoRA engine (adapters, their Adam state, RNG): the next step is
    bit-identical to the one the saved engine takes."""
    from mindspeed_rl.checkpoint.engine_io import load_engine, save_engine
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch, sft_loss

    dist.init_model_parallel(seed=11)
    role = tiny_role(lora_r=4, lr=1e-2)
    first, second = make_batch(4, 10, seed=8), make_batch(4, 10, seed=9)
    a = MegatronEngine(role, total_steps=6)
    a.train_step(first, sft_loss, 2)
    save_engine(a, str(tmp_path), 1)
    after = a.train_step(second, sft_loss, 2)
    b = MegatronEngine(role, total_steps=6)
    assert load_engine(b, str(tmp_path))["config"]["lora"] == {"r": 4, "alpha": 16.0, "dropout": 0.0}
    resumed = b.train_step(second, sft_loss, 2)
    assert resumed.loss == after.loss
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a.named_weights(), b.named_weights()))


def test_a_lora_run_on_a_base_checkpoint_saves_only_its_adapters(tmp_path):
    """Started from a base checkpoint, a LoRA run's checkpoints hold the adapters (and their Adam state) only;
    a resume completes them from the base (the next step bit-identical), the converter reads the merged
    model, and a changed or missing base is refused instead of combined."""
    import os

    from mindspeed_rl.checkpoint import megatron_layout as ml
    from mindspeed_rl.checkpoint.engine_io import load_engine, load_weights_only, save_engine
    from mindspeed_rl.checkpoint.megatron_reader import iter_mg_stages
    from mindspeed_rl.checkpoint.reshard import mg_to_mg
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch, sft_loss

    dist.init_model_parallel(seed=11)
    base_dir, ckpt = str(tmp_path / "base"), str(tmp_path / "ckpt")
    plain = MegatronEngine(tiny_role(), total_steps=2)
    save_engine(plain, base_dir, 1)
    role = tiny_role(lora_r=4, lr=1e-2)
    first, second = make_batch(4, 10, seed=8), make_batch(4, 10, seed=9)
    a = MegatronEngine(role, total_steps=6)
    load_weights_only(a, base_dir)
    a.train_step(first, sft_loss, 2)
    save_engine(a, ckpt, 1)
    merged = {k: v.clone() for k, v in a.export_weights()}
    after = a.train_step(second, sft_loss, 2)

    _, iter_dir = ml.latest_iteration_dir(ckpt)
    stored = ml.safe_load(ml.rank_file(iter_dir, 0, 0, 1))
    assert sorted(stored["model"]) == sorted(a.trainable_names()) and all("lora_" in n for n in stored["model"])
    assert stored["config"]["lora"]["base"]["path"] == os.path.abspath(base_dir)
    base_file = ml.rank_file(ml.latest_iteration_dir(base_dir)[1], 0, 0, 1)
    assert os.path.getsize(ml.rank_file(iter_dir, 0, 0, 1)) < os.path.getsize(base_file) / 2

    b = MegatronEngine(role, total_steps=6)
    load_engine(b, ckpt)
    assert b.train_step(second, sft_loss, 2).loss == after.loss
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a.named_weights(), b.named_weights()))
    ((_, stage),) = iter_mg_stages(ckpt)
    assert stage.keys() == merged.keys() and all(torch.allclose(stage[n], merged[n], atol=1e-6) for n in merged)
    mg_to_mg(ckpt, str(tmp_path / "tp2"), tp=2, pp=1)  # resharded: a whole model again, adapters kept
    first_rank = ml.safe_load(ml.rank_file(ml.latest_iteration_dir(str(tmp_path / "tp2"))[1], 0, 0, 1))
    assert "base" not in first_rank["config"]["lora"] and len(first_rank["model"]) > len(stored["model"])
    ((_, stage),) = iter_mg_stages(str(tmp_path / "tp2"))
    assert all(torch.allclose(stage[n], merged[n], atol=1e-6) for n in merged)

    # a bf16 run on the fp32 base: its adapter-only checkpoint reads back (the fingerprint is of the file's tensors)
    c = MegatronEngine(tiny_role(lora_r=4, bf16=True), total_steps=2)
    load_weights_only(c, base_dir)
    save_engine(c, str(tmp_path / "bf16"), 1)
    load_engine(MegatronEngine(tiny_role(lora_r=4, bf16=True), total_steps=2), str(tmp_path / "bf16"))
    save_engine(b, base_dir, 1)  # over the base's own iteration folder: the whole model stays there
    assert "embedding.word_embeddings.weight" in ml.safe_load(base_file)["model"]
    load_engine(MegatronEngine(role, total_steps=6), ckpt)

    with torch.no_grad():
        next(iter(plain.unwrapped().parameters())).add_(1e-3)
    save_engine(plain, base_dir, 1)  # the same folder, other weights
    with pytest.raises(ml.CheckpointError, match="trained on another base"):
        load_engine(MegatronEngine(role, total_steps=6), ckpt)
    moved = tiny_role(lora_r=4, lr=1e-2, lora_base_load=str(tmp_path / "elsewhere"))
    with pytest.raises(ml.CheckpointError, match="base checkpoint .*elsewhere is missing"):
        load_engine(MegatronEngine(moved, total_steps=6), ckpt)
    from mindspeed_rl.trainer.startup.preflight import check_role
    from mindspeed_rl.utils.cli import UserError

    check_role(tiny_role(lora_r=4, load=ckpt, finetune=False))
    with pytest.raises(UserError, match="actor_config.lora_base_load: .* holds LoRA adapters only"):
        check_role(tiny_role(lora_r=4, load=ckpt, finetune=False, lora_base_load=str(tmp_path / "elsewhere")))


def _write_base(folder: str, model: dict) -> None:
    """A one-rank checkpoint at iteration 1 holding ``model``."""
    from mindspeed_rl.checkpoint import megatron_layout as ml

    ml.begin_save(folder, 1)
    ml.write_rank(folder, 1, 0, 0, 1, {"model": model, "iteration": 1, "config": {}})
    ml.commit_save(folder, 1, 1)


def test_the_base_fingerprint_notices_swapped_rows_and_accepts_the_same_base(tmp_path):
    """The fingerprint is a digest of each frozen tensor's bytes: two swapped rows (same sum, same sum of
    squares) are refused naming the tensor; an unchanged base completes the adapters, in any dtype; a legacy
    [sum, sum of squares] record is still read and comes back with digests."""
    from mindspeed_rl.checkpoint import lora_base
    from mindspeed_rl.checkpoint import megatron_layout as ml

    gen = torch.Generator().manual_seed(0)
    base = {
        "decoder.layers.0.mlp.linear_fc1.weight": torch.randn(6, 4, generator=gen),
        "embedding.word_embeddings.weight": torch.randn(8, 4, generator=gen).to(torch.bfloat16),
        "decoder.final_layernorm.weight": torch.ones(4),
    }
    folder = str(tmp_path / "base")
    _write_base(folder, base)
    adapters = {"decoder.layers.0.mlp.linear_fc1.lora_A": torch.zeros(2, 4)}

    def adapter_only(fingerprint):
        record = dict(lora_base.origin(folder), fingerprint=fingerprint)
        return {"model": dict(adapters), "config": {"lora": {"r": 2, "base": record}}}

    digests = lora_base.fingerprint(base.items())
    done = lora_base.complete(adapter_only(digests), "mp_rank_00", "ckpt")
    assert sorted(done["model"]) == sorted([*base, *adapters])
    assert all(torch.equal(done["model"][n], t) for n, t in base.items())
    legacy = {n: [float(t.double().sum()), float(t.double().square().sum())] for n, t in base.items()}
    assert lora_base.base_of(lora_base.complete(adapter_only(legacy), "mp_rank_00", "ckpt"))["fingerprint"] == digests

    swapped = dict(base)
    swapped["embedding.word_embeddings.weight"] = base["embedding.word_embeddings.weight"][[1, 0, *range(2, 8)]]
    _write_base(folder, swapped)
    with pytest.raises(
        ml.CheckpointError, match=r"ckpt: .*another base .*\(embedding.word_embeddings.weight differs\)"
    ):
        lora_base.complete(adapter_only(digests), "mp_rank_00", "ckpt")
    lora_base.complete(adapter_only(legacy), "mp_rank_00", "ckpt")  # the legacy check misses it (documented)
    reshaped = dict(base, **{"decoder.final_layernorm.weight": torch.ones(2, 2)})
    _write_base(folder, reshaped)
    with pytest.raises(ml.CheckpointError, match=r"decoder.final_layernorm.weight differs"):
        lora_base.complete(adapter_only(digests), "mp_rank_00", "ckpt")


def test_peft_adapter_folder_reproduces_the_merged_model(tmp_path):
    """The PEFT export: per HF projection, base + (alpha / r) B A with the exported tensors equals the merged
    model's weight (fused q/k/v and gate/up split into PEFT's separate projections); loaded by peft when it
    is installed."""
    import json
    import os

    from safetensors.torch import load_file

    from mindspeed_rl.checkpoint.engine_io import save_engine
    from mindspeed_rl.checkpoint.megatron_reader import iter_mg_pieces
    from mindspeed_rl.checkpoint.peft_export import write_peft_adapter
    from mindspeed_rl.checkpoint.tp_split import fold_lora, layer_number
    from mindspeed_rl.families import get_family
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist

    dist.init_model_parallel(seed=11)
    role = tiny_role(lora_r=4, lora_alpha=8.0)
    engine = MegatronEngine(role, total_steps=2)
    randomize_adapters(engine)
    save_engine(engine, str(tmp_path / "ckpt"), 1)
    folder = write_peft_adapter(str(tmp_path / "ckpt"), str(tmp_path / "adapter"), "base-model")
    config = json.load(open(os.path.join(folder, "adapter_config.json")))
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    peft = load_file(os.path.join(folder, "adapter_model.safetensors"))
    family, checked = get_family(role.model.model_type_hf), 0
    for piece in iter_mg_pieces(str(tmp_path / "ckpt"), fold=False):
        for i in {layer_number(n) for n in piece if layer_number(n) >= 0}:
            base = family.layer_mcore_to_hf(i, {n: t for n, t in piece.items() if "lora_" not in n}, role.model)
            merged = family.layer_mcore_to_hf(i, fold_lora(piece, 2.0), role.model)
            for name, weight in merged.items():
                key = f"base_model.model.{name[: -len('.weight')]}"
                if f"{key}.lora_A.weight" in peft:
                    delta = peft[f"{key}.lora_B.weight"] @ peft[f"{key}.lora_A.weight"]
                    assert torch.allclose(base[name] + 2.0 * delta, weight, atol=1e-6), name
                    checked += 1
    assert checked == 2 * 7  # 2 layers x q, k, v, o, gate, up, down


def test_peft_loads_the_adapter_folder_onto_the_base_model(tmp_path):
    """With peft installed (not a dependency): base HF model + our adapter folder == our merged HF model."""
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from mindspeed_rl.checkpoint.convert import write_hf_folder
    from mindspeed_rl.checkpoint.engine_io import save_engine
    from mindspeed_rl.checkpoint.peft_export import write_peft_adapter
    from mindspeed_rl.families import get_family
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch

    dist.init_model_parallel(seed=11)
    role = tiny_role(lora_r=4, lora_alpha=8.0)
    lora = MegatronEngine(role, total_steps=2)
    randomize_adapters(lora)
    base = MegatronEngine(tiny_role(), total_steps=2)
    base.load_weights({n: t for n, t in lora.named_weights() if "lora_" not in n})
    save_engine(lora, str(tmp_path / "lora"), 1)
    save_engine(base, str(tmp_path / "base"), 1)
    hf_config = get_family(role.model.model_type_hf).hf_config(role.model, 0, 0)
    for name in ("base", "lora"):
        write_hf_folder(str(tmp_path / name), str(tmp_path / f"hf_{name}"), hf_config, None, progress=False)
    write_peft_adapter(str(tmp_path / "lora"), str(tmp_path / "adapter"), str(tmp_path / "hf_base"))
    ids = make_batch(2, 12, seed=3)["input_ids"].clamp(min=1)
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf_lora")).eval()(ids).logits
        base_model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf_base"))
        adapted = PeftModel.from_pretrained(base_model, str(tmp_path / "adapter")).eval()(ids).logits
    assert torch.allclose(adapted, merged, atol=1e-5)


@pytest.mark.parametrize("family", ["dense", "qwen3_moe"])
def test_the_converter_writes_the_merged_model_and_the_adapter_folder(tmp_path, capsys, family):
    """mg -> hf of a LoRA checkpoint: the merged model and the PEFT folder; with adapters on MoE experts
    (no PEFT form for transformers' fused experts) the merged model only, said on the console."""
    import json
    import os

    from cli import convert_ckpt
    from mindspeed_rl.checkpoint.engine_io import save_engine
    from mindspeed_rl.checkpoint.errors import ConversionError
    from mindspeed_rl.checkpoint.peft_export import write_peft_adapter
    from mindspeed_rl.families import get_family
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist

    dist.init_model_parallel(seed=11)
    role = tiny_role(lora_r=2, model=tiny_family_model(family) if family != "dense" else None)
    save_engine(MegatronEngine(role, total_steps=2), str(tmp_path / "ckpt"), 1)
    os.makedirs(tmp_path / "hf")
    with open(tmp_path / "hf" / "config.json", "w") as fh:
        json.dump(get_family(role.model.model_type_hf).hf_config(role.model, 0, 0), fh)
    argv = ["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(tmp_path / "ckpt"),
            "--save-dir", str(tmp_path / "hf")]  # fmt: skip
    assert convert_ckpt.main(argv) == 0
    assert os.path.isfile(tmp_path / "hf" / "mg2hf" / "config.json")
    if family == "dense":
        folder = sorted(os.listdir(tmp_path / "hf" / "mg2hf_adapter"))
        assert folder == ["adapter_config.json", "adapter_model.safetensors"]
        return
    assert "LoRA on MoE experts: no PEFT folder" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / "hf" / "mg2hf_adapter")
    with pytest.raises(ConversionError, match="experts carry LoRA adapters"):
        write_peft_adapter(str(tmp_path / "ckpt"), str(tmp_path / "adapter"))


def test_lora_and_plain_checkpoints_are_not_mixed_silently(tmp_path):
    """Adapters into a run without LoRA, other r/alpha, or a LoRA resume from a plain checkpoint: one clear
    error each (a plain checkpoint is still a valid finetune start for a LoRA run)."""
    from mindspeed_rl.checkpoint.engine_io import load_engine, load_weights_only, save_engine
    from mindspeed_rl.checkpoint.megatron_layout import CheckpointError
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist

    dist.init_model_parallel(seed=11)
    save_engine(MegatronEngine(tiny_role(lora_r=4), total_steps=2), str(tmp_path / "lora"), 1)
    save_engine(MegatronEngine(tiny_role(), total_steps=2), str(tmp_path / "plain"), 1)
    with pytest.raises(CheckpointError, match="carry LoRA adapters but actor_config.lora_r is 0"):
        load_weights_only(MegatronEngine(tiny_role(), total_steps=2), str(tmp_path / "lora"))
    with pytest.raises(CheckpointError, match="saved with LoRA r=4 alpha=16.0, the run has r=8"):
        load_engine(MegatronEngine(tiny_role(lora_r=8), total_steps=2), str(tmp_path / "lora"))
    with pytest.raises(CheckpointError, match="holds no LoRA adapters, so a LoRA run cannot resume from it"):
        load_engine(MegatronEngine(tiny_role(lora_r=4), total_steps=2), str(tmp_path / "plain"))
    load_weights_only(MegatronEngine(tiny_role(lora_r=4), total_steps=2), str(tmp_path / "plain"))


def test_adapter_dropout_is_off_in_eval_forwards():
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch

    dist.init_model_parallel(seed=11)
    engine = MegatronEngine(tiny_role(lora_r=4, lora_dropout=0.5), total_steps=2)
    randomize_adapters(engine)
    batch = make_batch(2, 10, seed=1)
    assert torch.equal(engine.forward(batch, 2)["log_probs"], engine.forward(batch, 2)["log_probs"])


def test_distributed_optimizer_shards_of_another_split_are_refused(tmp_path):
    """A shard file whose recorded parameter ranges differ from this run's (another DP size) is refused with
    the way out instead of torch's size error."""
    import glob

    from mindspeed_rl.checkpoint.engine_io import load_engine, save_engine
    from mindspeed_rl.checkpoint.megatron_layout import CheckpointError
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch, sft_loss

    dist.init_model_parallel(seed=11)
    role = tiny_role(use_distributed_optimizer=True)
    engine = MegatronEngine(role, total_steps=2)
    engine.train_step(make_batch(2, 8), sft_loss, 2)
    save_engine(engine, str(tmp_path), 1)
    (path,) = glob.glob(f"{tmp_path}/iter_0000001/*/distrib_optim_dp000.pt")
    saved = torch.load(path, weights_only=True)
    name, shape, start, end = saved["layout"][0][0]
    saved["layout"][0][0] = (name, shape, start, end // 2)  # as a rank of DP 2 would own it
    torch.save(saved, path)
    with pytest.raises(CheckpointError, match="saved for another split of the parameters"):
        load_engine(MegatronEngine(role, total_steps=2), str(tmp_path))


def test_the_frozen_output_layer_backward_stays_one_matmul():
    """The logits' gradient reaches the frozen output layer contiguous: no batched matmul over copies of the
    [vocab, hidden] weight (what made bf16 LoRA slower and larger than full training on CPU)."""
    from torch.profiler import ProfilerActivity, profile

    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.utils import dist
    from tests.helpers import make_batch, sft_loss

    dist.init_model_parallel(seed=11)
    engine = MegatronEngine(tiny_role(lora_r=4), total_steps=2)
    vocab, hidden = engine.unwrapped().output_layer.weight.shape
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        engine.train_step(make_batch(4, 10, seed=2), sft_loss, 2)
    batched = [e.input_shapes for e in prof.events() if e.name == "aten::bmm"]
    assert batched and not [s for s in batched if [vocab, hidden] in [list(x[1:]) for x in s if len(x) == 3]]
