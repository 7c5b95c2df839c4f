"""Router replay (R3) at unit level: routes on the [B, S] grid laid out as an MoE layer sees its tokens (packed,
trimmed, a CP rank's positions, a sequence-parallel slice), and the tiny Qwen3-MoE training forward replaying
routes: its own routes replayed give bitwise the same log-probs with no mismatch counted; forced routes are used
(log-probs change) and every forced token is counted as a mismatch."""

import pytest
import torch

from mindspeed_rl.models import router_replay
from mindspeed_rl.models.packing import pack, trim
from tests.helpers import assert_refused, make_batch, single_process_world_fixture, tiny_family_model, tiny_role

single_process_world = single_process_world_fixture(seed=5)


def token_routes(batch, layers=2, k=2):
    """Routes whose every entry names its token (its id), so a layout can be read back against input_ids."""
    ids = batch["input_ids"]
    return ids[:, :, None, None].expand(*ids.shape, layers, k).to(torch.int16).clone()


def test_routes_follow_the_tokens_into_every_computed_layout():
    batch = make_batch(3, 9, seed=4)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    routes = token_routes(batch)
    for inp in (pack(ids, mask, multiple=4), trim(ids, mask, multiple=2)):
        got = router_replay.routes_in_computed_layout(inp, routes)
        seq_first = inp.input_ids.transpose(0, 1).reshape(-1)  # megatron's [s, b] order
        real = got[:, 0, 0] >= 0
        assert torch.equal(got[real, 1, 1].long(), seq_first[real])
        assert int(real.sum()) == int(mask.sum())  # padding positions: -1, the router's own choice
    # a CP rank's positions, then a sequence-parallel TP rank's half of them
    inp = pack(ids, mask, multiple=8, row_multiple=4).split_context_parallel(2, 1)
    got = router_replay.routes_in_computed_layout(inp, routes, cp_rank=1)
    real = got[:, 0, 0] >= 0
    assert torch.equal(got[real, 0, 0].long(), inp.input_ids.transpose(0, 1).reshape(-1)[real])
    half = router_replay.routes_in_computed_layout(inp, routes, cp_rank=1, tp_rank=1, sp=2)
    assert torch.equal(half, got[got.shape[0] // 2 :])


def forward(engine, batch):
    return engine.forward(batch, micro_batch_size=4)["log_probs"]  # one micro-batch: one packed sequence


def test_the_training_forward_replays_the_routes_it_is_given():
    from mindspeed_rl.models.engine import MegatronEngine

    model = tiny_family_model("qwen3_moe")
    engine = MegatronEngine(tiny_role(model=model), trainable=False, remove_padding=True)
    batch = make_batch(4, 12, seed=9)
    plain = forward(engine, batch)
    # the router's own choices, read off one forward (packed: one sequence, b = 1, so the layer's token order is
    # the packed order)
    own = torch.full((*batch["input_ids"].shape, model.num_layers, model.moe_router_topk), -1, dtype=torch.int16)
    chosen = {}

    def recorder(number):
        def record(scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
            probs, top = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
            chosen[number] = top.clone()
            return probs, top

        return record

    engine.route_replays = router_replay.install(engine.model)
    for number, layer in engine.route_replays.items():
        layer.get_replay_topk = recorder(number)
    assert torch.equal(forward(engine, batch), plain)  # installed, nothing to replay: the same forward
    inp = engine.model_input(batch)
    for number, layer in engine.route_replays.items():
        own[inp.rows, inp.cols, number - 1] = chosen[number][inp.flat].to(torch.int16)
        del layer.get_replay_topk  # back to LayerReplay's own method
    replayed = forward(engine, {**batch, "routed_experts": own})
    assert torch.equal(replayed, plain)  # its own routes replayed: bitwise the same log-probs
    assert all(differ == 0 and tokens == int(batch["attention_mask"].sum()) for _, differ, tokens in
               router_replay.take_mismatch(engine.route_replays))  # fmt: skip
    # in micro-batches of 2 (each packed on its own) the routes still land on their tokens
    halves = engine.forward({**batch, "routed_experts": own}, micro_batch_size=2)["log_probs"]
    assert torch.equal(halves, engine.forward(batch, micro_batch_size=2)["log_probs"])
    router_replay.take_mismatch(engine.route_replays)
    forced = own.clone()
    forced[:, -4:, 0] = (4 - 1) - own[:, -4:, 0]  # layer 1's experts mirrored on the last 4 columns: other sets
    changed = (forced[:, :, 0].sort(-1).values != own[:, :, 0].sort(-1).values).any(-1)
    changed &= batch["attention_mask"].bool()
    moved = forward(engine, {**batch, "routed_experts": forced})
    assert not torch.equal(moved, plain)
    counts = {number: differ for number, differ, _ in router_replay.take_mismatch(engine.route_replays)}
    assert counts[1] == int(changed.sum()) > 0  # (layer 2 sees other inputs now: its count is its own)
    engine.replay_routes = False  # compared, not replayed: the router's own choice stands
    assert torch.equal(forward(engine, {**batch, "routed_experts": forced}), plain)
    assert torch.equal(forward(engine, batch), plain)  # a batch without routes: no stale targets


def test_routes_ride_with_their_sample_through_padding_widening_joins_and_resume(tmp_path):
    from mindspeed_rl.checkpoint.megatron_layout import safe_load
    from mindspeed_rl.protocol import Experience, build_experience
    from mindspeed_rl.protocol.rollout import RolloutOutput

    prompts = [[5, 6, 7], [8]]

    def output(i, prompt, response):  # routes name their position: prompt + response - 1 of them (the last: none)
        positions = len(prompt) + len(response) - 1
        routes = torch.arange(positions, dtype=torch.int16)[:, None, None].repeat(1, 2, 2)
        return RolloutOutput(i, response, [0.0] * len(response), "stop", routed_experts=routes)

    exp = build_experience(prompts, [output(0, prompts[0], [1, 2]), output(1, prompts[1], [3, 4, 9])], 1, 0)
    grid = exp.routed_experts[:, :, 0, 0]
    assert exp.prompt_width == 3 and grid.tolist() == [[0, 1, 2, 3, -1, -1], [-1, -1, 0, 1, 2, -1]]
    wide = exp.widened(5, 4, pad_id=0)  # two more prompt columns on the left, one more response column
    assert wide.routed_experts[:, :, 1, 1].tolist() == [[-1, -1, 0, 1, 2, 3, -1, -1, -1], [-1] * 4 + [0, 1, 2, -1, -1]]
    both = Experience.cat([exp, exp.select([1]).widened(4, 3, pad_id=0)], pad_id=0)
    assert both.routed_experts.shape == (3, 7, 2, 2) and both.routed_experts.dtype == torch.int16
    assert both.routed_experts[2, :, 0, 0].tolist() == [-1, -1, -1, 0, 1, 2, -1]
    # a parked trajectory keeps them through a checkpoint's trainer state (weights-only load)
    from mindspeed_rl.rollout.source.trajectory import Trajectory

    traj = Trajectory(0, prompts[0], "7", 8)
    traj.append([1, 2], [-0.5, -0.5], 0, trained=True, routes=output(0, prompts[0], [1, 2]).routed_experts)
    torch.save({"pool": [traj.state()]}, tmp_path / "state.pt")
    back = Trajectory.from_state(safe_load(str(tmp_path / "state.pt"))["pool"][0])
    assert torch.equal(back.output(0).routed_experts, traj.routes)


def test_router_replay_is_refused_where_it_cannot_work(capsys):
    from cli import train_ppo

    base = ["--config-name", "grpo_tiny_cpu", "dry_run=true", "rl_config.router_replay=R3"]
    moe = ["megatron_training.model=tiny_qwen3_moe", "actor_config.model=tiny_qwen3_moe"]
    for overrides, key, text in [
        ([], "rl_config.router_replay", "tiny_qwen25 has no experts"),
        (moe + ["generate_config.backend=fallback"], "generate_config.backend", "only with generate_config.batch_inv"),
        (moe + ["rl_config.router_replay=R4"], "rl_config.router_replay", "compare"),
        (moe + ["generate_config.enforce_eager=false"], "generate_config.enforce_eager", "CUDA graph"),
        (
            moe + ["rl_config.actor_resource.num_npus=2", "actor_config.tensor_model_parallel_size=2"],
            "actor_config.sequence_parallel",
            "only with sequence parallelism",
        ),  # fmt: skip
    ]:
        assert_refused(base + overrides, key, text, capsys)
    assert train_ppo.main(base + moe) == 0
    # on a device without sequence parallelism (CPU) a trained MoE model cannot use TP: refused before start
    from mindspeed_rl.accelerator import get_accelerator
    from mindspeed_rl.features import load_ppo_config, preflight
    from mindspeed_rl.utils.cli import UserError

    tp2 = ["rl_config.actor_resource.num_npus=2", "actor_config.tensor_model_parallel_size=2"]
    cfg = load_ppo_config("grpo_tiny_cpu", moe + tp2 + ["actor_config.sequence_parallel=true"])
    with pytest.raises(UserError, match="actor_config.tensor_model_parallel_size: 2 .* which cpu lacks"):
        preflight(cfg, get_accelerator())
