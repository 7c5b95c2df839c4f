"""Rollout: vLLM updated in place from megatron shards, log-prob agreement, the fallback engine."""

import os
import textwrap

import pytest
import torch

from mindspeed_rl.config_cls import GenerateConfig, SamplingConfig
from mindspeed_rl.protocol import RolloutRequest
from mindspeed_rl.rollout.engines.sampling import filter_logits, sample_next
from tests import parallel_worker
from tests.helpers import tiny_model_config

MODEL = dict(num_layers=4, hidden_size=128, ffn_hidden_size=256, padded_vocab_size=512)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [100, 200, 30, 250, 20]]


def random_full_weights(seed=0):
    from tests.helpers import random_full_weights as build

    model = tiny_model_config(**MODEL)
    return model, build(model, seed)


def write_hf_folder(folder, model, full):
    from safetensors.torch import save_file

    from mindspeed_rl.rollout.engines.engine_folder import write_hf_config
    from mindspeed_rl.rollout.weights.convert_names import hf_named

    write_hf_config(str(folder), model, eos_token_id=0, pad_token_id=0)
    save_file({k: v.contiguous() for k, v in hf_named([full], model)}, str(folder / "model.safetensors"))


WEIGHT_LOADS = ["auto", "load_weights"]
QUANTIZED = ["fp8", "int8"]


@pytest.fixture(scope="module")
def updated_and_fresh(tmp_path_factory):
    """Both weight-update paths and the fresh engine they are compared with, then the FP8 engines, one after another
    in one spawned process (one start-up and one set of imports): {weight_load: updated outputs, "fresh": greedy
    ids, "fp8" / "int8": run_quantized_engine's log-probs}."""
    workdir = tmp_path_factory.mktemp("updated")
    model, full = random_full_weights()
    torch.save(full, workdir / "actor_full.pt")
    torch.save(PROMPTS, workdir / "prompts.pt")
    write_hf_folder(workdir / "hf", model, full)
    updated = [("run_updated_engine", {"weight_load": w, "out": f"updated_{w}.pt"}) for w in WEIGHT_LOADS]
    quantized = [("run_quantized_engine", {"precision": p}) for p in QUANTIZED]
    parallel_worker.spawn_each(1, updated + [("run_fresh_engine", {})] + quantized, workdir)
    results = {w: torch.load(workdir / f"updated_{w}.pt") for w in WEIGHT_LOADS}
    results.update({p: torch.load(workdir / f"quantized_{p}.pt", weights_only=False) for p in QUANTIZED})
    return {**results, "fresh": torch.load(workdir / "fresh.pt")}


@pytest.mark.slow
@pytest.mark.parametrize("weight_load", WEIGHT_LOADS)
def test_vllm_updated_in_place_equals_a_fresh_engine_and_seeds_repeat(updated_and_fresh, weight_load):
    """Both weight-update paths: vLLM's layer-wise reload_weights (what 'auto' picks on the CPU stacks) and
    the load_weights path of workers without it (vllm-ascend 0.18), forced here on the CPU worker."""
    updated, fresh = updated_and_fresh[weight_load], updated_and_fresh["fresh"]
    assert updated["method"] == ("reload_weights" if weight_load == "auto" else "load_weights")
    assert updated["greedy"] == fresh
    assert updated["runs"][0] == updated["runs"][1]  # same seed, same samples
    assert updated["runs"][0] != updated["other_seed"]  # another seed, other samples
    assert len(updated["runs"][0]) == 3 * len(PROMPTS)


@pytest.mark.slow
@pytest.mark.parametrize("precision", QUANTIZED)
def test_quantized_rollout_samples_from_the_requantized_weights(updated_and_fresh, precision):
    """generate_config.rollout_quantization: after two in-place updates the engine's log-probs of its own samples
    equal those of a fresh quantized engine loaded from the same weights (FP8: vLLM quantized them again at the
    reload; INT8: we did, before the transfer), and differ from a bf16 engine's on the same tokens: the
    behaviour log-probs are the quantized policy's."""
    result = updated_and_fresh[precision]
    if "unavailable" in result:
        pytest.skip(result["unavailable"])
    logprobs, sequences = result["logprobs"], result["sequences"]
    assert result["method"] == "reload_weights" and len(sequences) == len(PROMPTS)

    def gaps(a, b):
        return [abs(x - y) for row_a, row_b in zip(logprobs[a], logprobs[b]) for x, y in zip(row_a, row_b)]

    assert max(gaps(precision, "fresh")) < 1e-5  # measured 0.0: the same quantized weights
    to_bf16 = gaps(precision, "bf16")
    assert sum(to_bf16) / len(to_bf16) > 1e-3, max(to_bf16)  # measured mean fp8 0.074, int8 0.026 (bf16 vs HF 0.008)
    for sampled, scored, seq in zip(logprobs["sampled"], logprobs[precision], sequences):
        assert scored[-len(sampled) :] == pytest.approx(sampled, abs=1e-3)  # the samples' own log-probs


def test_int8_rollout_weights_are_compressed_tensors_own():
    """The INT8 engine's weights, quantized on the training side, equal what the compressed-tensors library makes of
    the same weights with the scheme the engine's config declares; only the decoder projections are quantized."""
    args = pytest.importorskip("compressed_tensors.quantization").QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    from mindspeed_rl.rollout.weights.quantize import int8_named, int8_quantization_config, is_int8_target

    scheme = int8_quantization_config()["config_groups"]["rollout_int8"]["weights"]
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 3, 48)[:, None]
    weight[5] = 0.0  # an all-zero channel
    named = dict(int8_named([("model.layers.3.self_attn.q_proj.weight", weight), ("model.norm.weight", weight[0])]))
    quantized, scale = (
        named["model.layers.3.self_attn.q_proj.weight"],
        named["model.layers.3.self_attn.q_proj.weight_scale"],
    )
    ct_scale, zero = calculate_qparams(
        weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True), args(**scheme)
    )
    assert quantized.dtype == torch.int8 and scale.shape == (48, 1)
    assert torch.equal(scale, ct_scale)
    assert torch.equal(quantized, quantize(weight, scale, zero, args(**scheme), dtype=torch.int8))
    assert (quantized.float() * scale - weight).abs().max() <= scale.max() / 2 + 1e-6  # half a step at most
    assert torch.equal(named["model.norm.weight"], weight[0])
    assert [is_int8_target(n) for n in ("model.layers.0.mlp.down_proj", "model.layers.0.mlp.experts.3.up_proj")] == [
        True,
        False,
    ]
    assert not is_int8_target("lm_head") and not is_int8_target("model.visual.blocks.0.mlp.gate_proj")


ROLLOUT_LAYOUTS = [dict(name="tp2", tp=2, pp=1), dict(name="pp2", tp=1, pp=2)]


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    """Both layouts one after another in one spawned world of 2 (one start-up and one set of imports)."""
    workdir = tmp_path_factory.mktemp("rollout")
    _, full = random_full_weights(1)
    torch.save(full, workdir / "actor_full.pt")
    specs = [dict(layout, backend="vllm", temperature=0.8) for layout in ROLLOUT_LAYOUTS]
    parallel_worker.spawn_each(2, [("run_rollout", spec) for spec in specs], workdir)
    return {s["name"]: torch.load(workdir / f"rollout_{s['name']}.pt", weights_only=False) for s in specs}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ROLLOUT_LAYOUTS)
def test_rollout_logprobs_equal_the_megatron_actor(rollouts, layout):
    result = rollouts[layout["name"]]
    width = result["ids"].shape[1]
    worst = 0.0
    for i, (prompt, response, logps) in enumerate(result["rows"]):
        start = width - len(prompt) - len(response) + len(prompt)
        actor = result["actor_logp"][i, start : start + len(response)]
        worst = max(worst, (actor - torch.tensor(logps)).abs().max().item())
    assert len(result["rows"]) == 8 and worst <= 1e-4, worst
    assert result["stats"]["tensors"] == 3 + 4 * 12  # embedding, norm, head + 12 HF tensors per layer


@pytest.mark.slow
def test_resharding_relations_give_each_engine_the_weights_of_a_fresh_engine(tmp_path):
    """Train TP 2 -> infer TP 1 (4 engines), TP 2 -> TP 2, TP 1 -> TP 2 and TP 2 x PP 2 -> TP 2 (2 engines
    each) in one world of 4: every engine rank's greedy ids equal a fresh engine of the same infer TP
    loaded from the same weights as a HF folder."""
    model, full = random_full_weights(3)
    torch.save(full, tmp_path / "actor_full.pt")
    torch.save(PROMPTS, tmp_path / "prompts.pt")
    write_hf_folder(tmp_path / "hf", model, full)
    parallel_worker.spawn("run_reshard_relations", 4, {}, tmp_path)
    for rank in range(4):
        results = torch.load(tmp_path / f"reshard_rank{rank}.pt")
        assert set(results) == {c["name"] for c in parallel_worker.RESHARD_CASES}
        for name, (updated, fresh) in results.items():
            assert len(updated) == len(PROMPTS) and all(len(ids) == 10 for ids in updated), (rank, name)
            assert updated == fresh, (rank, name)


def test_fallback_engine_greedy_matches_argmax_and_update_is_complete():
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.rollout.engines.factory import make_rollout_engine
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights
    from mindspeed_rl.utils import dist
    from tests.helpers import tiny_role

    dist.init_distributed()
    try:
        dist.init_model_parallel(seed=2)
        model = tiny_model_config()  # head_dim 16: vLLM's CPU backend cannot run it -> fallback
        actor = MegatronEngine(tiny_role(model=model), trainable=False)
        engine = make_rollout_engine(model, GenerateConfig(backend="auto"), "cpu", eos_token_id=None)
        assert engine.name == "fallback"
        stats = engine.update_weights(iter_full_weights(actor))
        assert stats["tensors"] == len(list(actor.named_weights()))
        outs = engine.generate(RolloutRequest.of(PROMPTS, SamplingConfig(temperature=0, max_tokens=5)))
        assert [o.prompt_index for o in outs] == [0, 1, 2]
        # teacher-forced check: each greedy token is the argmax of the actor's next-token distribution
        for prompt, out in zip(PROMPTS, outs):
            seq = torch.tensor([prompt + out.response_ids])
            logp = actor.forward({"input_ids": seq, "attention_mask": torch.ones_like(seq)}, 1)["log_probs"]
            assert torch.allclose(logp[0, len(prompt) :], torch.tensor(out.logprobs), atol=1e-5)
        sampled = engine.generate(
            RolloutRequest.of(PROMPTS, SamplingConfig(temperature=1.0, max_tokens=5, seed=3), n=2)
        )
        again = engine.generate(RolloutRequest.of(PROMPTS, SamplingConfig(temperature=1.0, max_tokens=5, seed=3), n=2))
        assert [o.response_ids for o in sampled] == [o.response_ids for o in again]
        assert [o.prompt_index for o in sampled] == [0, 0, 1, 1, 2, 2]
    finally:
        dist.destroy()


def test_backend_vllm_refused_with_reason_when_it_cannot_run_the_model():
    from mindspeed_rl.rollout.engines.factory import RolloutUnavailable, make_rollout_engine

    with pytest.raises(RolloutUnavailable, match="head_dim"):
        make_rollout_engine(tiny_model_config(), GenerateConfig(backend="vllm"), "cpu", eos_token_id=0)


def test_sampling_filters():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)[0, 2:]).all()
    kept = ~torch.isinf(filter_logits(logits, top_p=0.6))
    assert kept.tolist() == [[True, False, False, False]]
    assert (~torch.isinf(filter_logits(logits, min_p=0.3))).sum() == 2
    tokens, logp = sample_next(logits, temperature=0)
    assert tokens.item() == 0 and torch.allclose(logp, logits.log_softmax(-1)[:, 0])


SMALL_VLLM_RUNS = textwrap.dedent("""
    import os, sys, traceback
    sys.path.insert(0, ".")
    from mindspeed_rl.config_cls import GenerateConfig, SamplingConfig
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.engines.vllm_engine import VllmEngine
    from tests.helpers import tiny_model_config
    m = tiny_model_config(num_layers=1, hidden_size=128, ffn_hidden_size=128, padded_vocab_size=512)
    gen = GenerateConfig(dtype="float32", max_model_len=64, max_num_seqs=8, max_num_batched_tokens=512,
                         gpu_memory_utilization=0.002)

    def distinct_samples():  # test_vllm_samples_of_one_prompt_differ
        e = VllmEngine(m, gen, "cpu", 0)
        outs = e.generate(RolloutRequest.of([[1, 2, 3]], SamplingConfig(temperature=1.0, max_tokens=8, seed=5), n=4))
        print("DISTINCT", len({tuple(o.response_ids) for o in outs}), flush=True)
        e.shutdown()

    def eos_and_budgets():  # test_vllm_ignore_eos_and_min_tokens_pass_through
        probe = VllmEngine(m, gen, "cpu", 0)
        greedy_one = SamplingConfig(temperature=0, max_tokens=1)
        first = probe.generate(RolloutRequest.of([[1, 2, 3]], greedy_one))[0].response_ids[0]
        probe.shutdown()
        e = VllmEngine(m, gen, "cpu", first)   # EOS = the greedy first token: greedy stops at once
        def greedy(**kw):
            return e.generate(RolloutRequest.of([[1, 2, 3]], SamplingConfig(temperature=0, max_tokens=8, **kw)))[0]
        print("LENGTHS", len(greedy().response_ids), len(greedy(ignore_eos=True).response_ids),
              first in greedy(min_tokens=5).response_ids[:5], len(greedy(min_tokens=5).response_ids) >= 5, flush=True)
        no_eos = SamplingConfig(temperature=0, max_tokens=8, ignore_eos=True)
        capped = e.generate(RolloutRequest.of([[1, 2, 3], [4, 5]], no_eos, n=2, max_new_tokens=[3, 20]))
        print("BUDGETS", *[len(o.response_ids) for o in capped], flush=True)
        e.shutdown()

    def long_prompts():  # test_vllm_on_cpu_samples_many_distinct_long_prompts_with_seeds
        e = VllmEngine(m, GenerateConfig(dtype="float32", max_model_len=64, max_num_seqs=64,
                                         max_num_batched_tokens=128, gpu_memory_utilization=0.002), "cpu", 0)
        prompts = [[(7 * i + j) % 500 + 1 for j in range(40)] for i in range(24)]   # 960 distinct prompt tokens
        outs = e.generate(RolloutRequest.of(prompts, SamplingConfig(temperature=1.0, max_tokens=4, seed=5), n=1))
        print("DONE", len(outs), sum(len(o.response_ids) for o in outs), flush=True)
        folder = e._dir
        e.release_at_exit()   # the end of a worker's run: its folder goes, vLLM's own teardown is left to the exit
        print("RELEASED", os.path.isdir(folder), e.llm is not None, flush=True)

    for run in (distinct_samples, eos_and_budgets, long_prompts):  # a failure leaves the next runs to report
        try:
            run()
        except Exception:
            print(f"{run.__name__} failed:", file=sys.stderr)
            traceback.print_exc()
""")


@pytest.fixture(scope="module")
def small_vllm_runs():
    """The small vLLM engines of the three regression tests below, one after another in one subprocess (one
    start-up and one vLLM import): (stdout, stderr)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", SMALL_VLLM_RUNS],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    return proc.stdout, proc.stderr


def test_vllm_samples_of_one_prompt_differ(small_vllm_runs):
    """Regression: vLLM gives the n children of a seeded request one seed (identical samples)."""
    out, err = small_vllm_runs
    line = [x for x in out.splitlines() if x.startswith("DISTINCT")]
    assert line, err[-2000:]
    assert int(line[0].split()[1]) == 4


class EosLovingModel(torch.nn.Module):
    """Next-token logits that always prefer token 7 (the EOS of these tests), then token 3."""

    def forward(self, ids, position_ids, mask):
        logits = torch.zeros(ids.shape[0], ids.shape[1], 16)
        logits[..., 7], logits[..., 3] = 5.0, 4.0
        return logits


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fallback_ignore_eos_and_min_tokens(temperature):
    from mindspeed_rl.rollout.engines.fallback import generate

    model, prompts = EosLovingModel(), [[1, 2], [4]]

    def run(**kw):
        return generate(model, prompts, 6, eos_token_id=7, temperature=temperature, seed=0, **kw)

    if temperature == 0:
        assert [o.response_ids for o in run()] == [[7], [7]]  # EOS first, so it stops at once
    fixed = run(ignore_eos=True)
    assert all(len(o.response_ids) == 6 and o.finish_reason == "length" for o in fixed)
    held = run(min_tokens=4)
    for out in held:
        assert len(out.response_ids) >= 4 and 7 not in out.response_ids[:4]
        # the reported log-prob is the unconstrained one (what the actor recomputes; temperature 1 or greedy)
        full = torch.log_softmax(EosLovingModel()(torch.zeros(1, 1), None, None)[0, 0], -1)
        expected = [float(full[t]) for t in out.response_ids]
        assert out.logprobs == pytest.approx(expected, abs=1e-5)
    if temperature == 0:
        assert [o.response_ids for o in held] == [[3, 3, 3, 3, 7], [3, 3, 3, 3, 7]]
    budgets = run(ignore_eos=True, caps=[2, 9])  # per-prompt budgets, capped by max_new_tokens (6)
    assert [len(o.response_ids) for o in budgets] == [2, 6]


def test_vllm_ignore_eos_and_min_tokens_pass_through(small_vllm_runs):
    """vLLM learns EOS from config.json (no tokenizer): ignore_eos and min_tokens must reach it."""
    out, err = small_vllm_runs
    line = [x for x in out.splitlines() if x.startswith("LENGTHS")]
    assert line, err[-2000:]
    assert line[0].split()[1:] == ["1", "8", "False", "True"]
    budgets = [x for x in out.splitlines() if x.startswith("BUDGETS")]
    assert budgets[0].split()[1:] == ["3", "3", "8", "8"]  # per-prompt budgets, capped by max_tokens


def test_one_vocabulary_rule_the_whole_padded_vocabulary_everywhere():
    """Rollout (fallback, like vLLM) samples over the model's padded vocabulary, the actor normalises over
    it, and the verifiers' text leaves out (and counts) ids the tokenizer does not have."""
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.rollout.engines.fallback_engine import FallbackEngine
    from mindspeed_rl.rollout.weights.resharding import iter_full_weights
    from mindspeed_rl.trainer.ppo.prompts import decode_responses
    from mindspeed_rl.utils import dist
    from tests.helpers import tiny_role

    dist.init_distributed()
    try:
        dist.init_model_parallel(seed=2)
        model = tiny_model_config()
        actor = MegatronEngine(tiny_role(model=model), trainable=False)
        with torch.no_grad():  # make the padding rows (ids >= 200 of 256) the likeliest tokens
            actor.unwrapped().output_layer.weight[200:] *= 40
        engine = FallbackEngine(model, eos_token_id=None)
        engine.update_weights(iter_full_weights(actor))
        outs = engine.generate(RolloutRequest.of(PROMPTS, SamplingConfig(temperature=1.0, max_tokens=6, seed=4)))
        sampled = [t for o in outs for t in o.response_ids]
        assert max(sampled) >= 200, sampled
        for prompt, out in zip(PROMPTS, outs):  # rollout log-probs == the actor's, over the same vocabulary
            seq = torch.tensor([prompt + out.response_ids])
            logp = actor.forward({"input_ids": seq, "attention_mask": torch.ones_like(seq)}, 1)["log_probs"]
            assert torch.allclose(logp[0, len(prompt) :], torch.tensor(out.logprobs), atol=1e-5)

        class Tokenizer:  # a 200-token tokenizer
            def __len__(self):
                return 200

            def decode(self, ids, skip_special_tokens=True):
                assert all(i < 200 for i in ids)
                return " ".join(map(str, ids))

        ids = torch.tensor([[5, 250, 7], [201, 3, 0]])
        texts, outside = decode_responses(Tokenizer(), ids, torch.tensor([[1, 1, 1], [1, 1, 0]]))
        assert texts == ["5 7", "3"] and outside == 2
    finally:
        dist.destroy()


def test_vllm_on_cpu_samples_many_distinct_long_prompts_with_seeds(small_vllm_runs):
    """Regression: prompts that do not all fit one engine step (partial rollout's continuations) made vLLM split
    a prefill and rewind that request's seeded generator, which CPU generators cannot do."""
    out, err = small_vllm_runs
    line = [x for x in out.splitlines() if x.startswith("DONE")]
    assert line and line[0].split()[1] == "24", err[-2000:]


def test_an_engine_released_at_the_end_of_a_run_leaves_no_folder_and_skips_vllms_teardown(small_vllm_runs):
    """A worker's engine at the end of its run (the process is killed next): its config folder removed, the LLM
    kept (vLLM's teardown, ~0.9 s per engine, would free nothing the exit does not)."""
    out, err = small_vllm_runs
    line = [x for x in out.splitlines() if x.startswith("RELEASED")]
    assert line and line[0].split()[1:] == ["False", "True"], err[-2000:]


def test_the_megatron_core_engine_is_refused_before_start_at_actor_tp_or_ep_above_one(monkeypatch):
    """The fallback engine inside the actor is an unsharded copy built under the actor's megatron groups: at EP 2
    its MoE layers held only the rank's experts (KeyError at the first weight update, after the whole start-up),
    at TP 2 its layers were TP shards. Refused before Ray starts, naming the key and why the fallback runs."""
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.startup.rollout_checks import check_fallback_layout
    from mindspeed_rl.utils.cli import UserError

    moe = ["megatron_training.model=tiny_qwen3_moe", "actor_config.model=tiny_qwen3_moe"]
    ep2 = moe + ["actor_config.expert_model_parallel_size=2", "rl_config.actor_resource.num_npus=2"]
    with pytest.raises(UserError, match=r"actor_config.expert_model_parallel_size 2: .*backend is fallback"):
        check_fallback_layout(load_ppo_config("grpo_tiny_cpu", ep2 + ["generate_config.backend=fallback"]))
    import mindspeed_rl.rollout.engines.vllm_engine as vllm_engine

    with monkeypatch.context() as patch:  # auto where the installed vLLM runs the model: its engines, any layout
        patch.setattr(vllm_engine, "vllm_unusable_reason", lambda *args, **kwargs: None)
        check_fallback_layout(load_ppo_config("grpo_tiny_cpu", ep2))
    # auto on a model vLLM's CPU attention cannot run (head_dim 16): the fallback, so TP 2 is refused with the reason
    tp2 = ["actor_config.tensor_model_parallel_size=2", "rl_config.actor_resource.num_npus=2"]
    narrow = load_ppo_config("grpo_tiny_cpu", tp2 + ["model.tiny_qwen25.hidden_size=64"])
    with pytest.raises(UserError, match=r"tensor_model_parallel_size 2: .*backend auto takes it because"):
        check_fallback_layout(narrow)


def test_the_megatron_core_engine_refuses_to_build_under_sharded_groups(monkeypatch):
    """A config built in code skips the preflight: the engine itself says why instead of a KeyError later."""
    from megatron.core import parallel_state as ps

    from mindspeed_rl.rollout.engines.fallback_engine import FallbackEngine

    monkeypatch.setattr(ps, "model_parallel_is_initialized", lambda: True)
    monkeypatch.setattr(ps, "get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(ps, "get_expert_model_parallel_world_size", lambda: 2)
    with pytest.raises(ValueError, match="TP 1 x EP 2: build it at actor TP 1 and EP 1"):
        FallbackEngine(tiny_model_config(), eos_token_id=0)


def test_an_engine_is_built_with_the_heap_frozen_after_its_garbage_is_collected():
    """freeze_heap (before every vLLM engine is built) collects first: a reference cycle dropped before it is freed,
    not kept for the process's life; what is alive leaves the collector's rounds (vLLM's collections while it loads
    a model skip it)."""
    import gc
    import weakref

    from mindspeed_rl.rollout.engines.vllm_engine import freeze_heap

    class Node:
        pass

    dropped, kept = Node(), Node()
    dropped.me = dropped
    gone = weakref.ref(dropped)
    del dropped
    try:
        freeze_heap()
        assert gone() is None
        assert gc.get_freeze_count() > 0 and not any(o is kept for o in gc.get_objects())
    finally:
        gc.unfreeze()
