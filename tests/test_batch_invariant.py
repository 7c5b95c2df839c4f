"""The zero-difference check (generate_config.batch_invariant): batch-invariant products and attention, then the
megatron-core rollout engine's sampled log-probs against the actor's recomputed ones, bitwise, for the tiny dense
model and the tiny Qwen3-MoE with routes replayed (and provably different routes without replay)."""

import torch
import torch.nn.functional as F

from mindspeed_rl.models import batch_invariant as bi
from tests.helpers import assert_refused, single_process_world_fixture, tiny_family_model, tiny_model_config, tiny_role

single_process_world = single_process_world_fixture(seed=5)


def test_products_and_attention_do_not_depend_on_the_rest_of_the_call():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(150, 48, generator=g), torch.randn(80, 48, generator=g)
    whole = bi.tiled_matmul(x, w.t())
    assert torch.allclose(whole, x @ w.t(), atol=1e-5)
    for rows in (1, 7, 33, 64, 149):  # a prefix, a shuffled batch: the same rows bitwise
        assert torch.equal(bi.tiled_matmul(x[:rows], w.t()), whole[:rows])
    order = torch.randperm(150, generator=g)
    assert torch.equal(bi.tiled_matmul(x[order], w.t()), whole[order])
    q, k, v = (torch.randn(2, 4, 70, 16, generator=g) for _ in range(3))
    full = bi.blocked_causal_attention(q, k, v, 0.25)
    assert torch.allclose(full, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25), atol=1e-6)
    for length in (1, 5, 32, 33, 64, 69):  # what comes after position i never enters its result
        head = (t[..., :length, :] for t in (q, k, v))
        assert torch.equal(bi.blocked_causal_attention(*head, 0.25), full[..., :length, :])
    with bi.batch_invariant():  # the mode routes torch's calls through them
        assert torch.equal(F.linear(x, w), whole) and torch.equal(x @ w.t(), whole)
        assert torch.equal(torch.addmm(w[:, 0], x, w.t()), w[:, 0] + whole)
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25), full)
    with bi.batch_invariant(False):  # off: torch's own kernel, which rounds by length
        plain = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
        head = [t[..., :33, :] for t in (q, k, v)]
        assert not torch.equal(F.scaled_dot_product_attention(*head, is_causal=True, scale=0.25), plain[..., :33, :])


def rollout_and_actor(model, force_runner_up=False):
    """Responses from the fallback engine in batch-invariant mode (with the actor's weights) as a [B, S] batch
    with the rollout's log-probs and routes, and the actor (packed, batch-invariant)."""
    from mindspeed_rl.config_cls.generate_config import SamplingConfig
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.protocol import build_experience
    from mindspeed_rl.protocol.rollout import RolloutRequest
    from mindspeed_rl.rollout.engines.fallback_engine import FallbackEngine

    actor = MegatronEngine(tiny_role(model=model), trainable=False, remove_padding=True)
    actor.batch_invariant = True
    moe = bool(model.num_experts)
    engine = FallbackEngine(model, eos_token_id=3, batch_invariant=True, capture_routes=moe)
    engine.update_weights([dict(actor.export_weights())])
    if force_runner_up:  # the rollout's routers pushed off their best expert: every route differs from the actor's

        def runner_up(scores, probs, own):
            chosen = scores.topk(own.shape[1] + 1, dim=-1).indices[:, 1:]
            return scores.gather(1, chosen), chosen

        for layer in engine.route_recorders.values():
            layer.route = runner_up
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (5, 9, 7, 12)]
    outs = engine.generate(RolloutRequest(prompts=prompts, n=2, seed=3, sampling=SamplingConfig(max_tokens=40)))
    exp = build_experience(prompts, outs, 2, 0)
    batch = {"input_ids": exp.input_ids, "attention_mask": exp.attention_mask}
    if moe:
        batch["routed_experts"] = exp.routed_experts
    return actor, batch, exp


def differences(actor, batch, exp, micro_batch_size):
    log_probs = actor.forward(batch, micro_batch_size=micro_batch_size)["log_probs"][:, exp.prompt_width :]
    mask = exp.response_mask.bool()
    diff = (log_probs - exp.rollout_log_probs).abs()[mask]
    return float(diff.max()), float((diff == 0).float().mean())


def test_dense_rollout_and_recomputed_log_probs_are_bitwise_equal():
    actor, batch, exp = rollout_and_actor(tiny_model_config())
    assert int(exp.response_mask.sum()) > 100
    for micro_batch_size in (1, 3, 8):  # whatever the actor's micro-batches
        assert differences(actor, batch, exp, micro_batch_size) == (0.0, 1.0)
    actor.batch_invariant = False
    print("dense, plain numerics: max |diff|", differences(actor, batch, exp, 8)[0])


def test_moe_with_replayed_routes_is_bitwise_equal_and_without_them_is_not():
    from mindspeed_rl.models import router_replay

    model = tiny_family_model("qwen3_moe")
    actor, batch, exp = rollout_and_actor(model)
    routes = exp.routed_experts
    assert routes.shape[2:] == (model.num_layers, model.moe_router_topk)
    routed = (routes[..., 0, 0] >= 0) & exp.attention_mask.bool()  # every real token but the last sampled one
    assert torch.equal(routed.sum(1), exp.attention_mask.sum(1) - 1) and not bool(routed[:, -1].any())
    assert differences(actor, batch, exp, 4) == (0.0, 1.0)  # the engine's own routes: the actor's
    actor, batch, exp = rollout_and_actor(model, force_runner_up=True)
    assert differences(actor, batch, exp, 4) == (0.0, 1.0)  # replayed: the rollout's (forced) experts exactly
    counts = router_replay.take_mismatch(actor.route_replays)
    assert all(differ == tokens > 0 for _, differ, tokens in counts), counts  # every routed token differed
    actor.replay_routes = False
    worst, exact = differences(actor, batch, exp, 4)
    assert worst > 1e-2 and exact < 0.5, (worst, exact)  # the actor's own routes: another distribution
    print("MoE, forced routes: max |diff| without replay", worst, "with replay 0.0")


def test_the_mode_is_refused_where_it_cannot_be_exact(capsys):
    from cli import train_ppo

    base = ["--config-name", "grpo_tiny_cpu", "dry_run=true", "generate_config.batch_invariant=true"]
    fallback = ["generate_config.backend=fallback", "rl_config.use_remove_padding=true"]
    for overrides, key, text in [
        ([], "generate_config.backend", "only the megatron-core engine"),
        (fallback + ["rl_config.use_remove_padding=false"], "rl_config.use_remove_padding", "not batch-invariant"),
        (fallback + ["actor_config.tensor_model_parallel_size=2"], "actor_config.tensor_model_parallel_size", "use 1"),
        (fallback + ["actor_config.lora_r=4"], "actor_config.lora_r", "merged weights"),
    ]:
        assert_refused(base + overrides, key, text, capsys)
    assert train_ppo.main(base + fallback) == 0
