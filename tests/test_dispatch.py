"""Typed experience and the worker group's dispatch: prompts by engine, rows by train DP, mini-batches
with their global token count; a broken dispatch contract is refused."""

import numpy as np
import pytest
import torch

from mindspeed_rl.protocol import (
    Experience,
    ForwardAnswer,
    MiniBatch,
    RankLayout,
    RolloutOutput,
    RolloutRequest,
    RolloutResult,
    build_experience,
)
from mindspeed_rl.workers.worker_group import DispatchError, WorkerGroup


def outputs_for(prompts, n):
    return [
        RolloutOutput(p, [10 + p, 20 + k][: 1 + (p + k) % 2], [-0.5, -0.25][: 1 + (p + k) % 2], "stop")
        for p in range(len(prompts))
        for k in range(n)
    ]


def test_build_experience_layout_and_field_shapes():
    prompts = [[1, 2, 3], [4], [5, 6]]
    arrived = sorted(outputs_for(prompts, 2), key=lambda o: -o.prompt_index)  # engines answer in any order
    exp = build_experience(prompts, arrived, 2, pad_id=0, labels=["a", "b", "c"])
    assert exp.num_rows == 6 and exp.prompt_width == 3 and exp.response_width == 2
    assert exp.group.tolist() == [0, 0, 1, 1, 2, 2] and exp.labels == ["a", "a", "b", "b", "c", "c"]
    assert exp.input_ids[3].tolist() == [0, 0, 4, 11, 0]  # left-padded prompt | right-padded response
    assert exp.attention_mask[3].tolist() == [0, 0, 1, 1, 0]
    assert exp.response_mask.sum(1).tolist() == [1, 2, 2, 1, 1, 2]
    with pytest.raises(ValueError, match=r"values: shape \(6, 3\), expected \(6, 2\)"):
        exp.set("values", torch.zeros(6, 3))
    with pytest.raises(KeyError, match="no field 'value'"):
        exp.set("value", torch.zeros(6, 2))
    with pytest.raises(RuntimeError, match="prompt 1: 1 responses, expected 2"):
        build_experience(prompts, outputs_for(prompts, 2)[:2] + outputs_for(prompts, 2)[3:], 2, 0)


def test_select_split_cat_round_trip():
    prompts = [[1, 2], [3], [4, 5], [6]]
    exp = build_experience(prompts, outputs_for(prompts, 2), 2, pad_id=0, labels=list("wxyz"))
    exp.set("advantages", torch.arange(16, dtype=torch.float32).view(8, 2))
    parts = exp.split(4)
    assert [p.num_rows for p in parts] == [2, 2, 2, 2] and parts[1].labels == ["x", "x"]
    back = Experience.cat(parts)
    for name in exp.present():
        assert torch.equal(getattr(back, name), getattr(exp, name)), name
    only = exp.select([5, 1], ["advantages"])
    assert only.present() == ["input_ids", "attention_mask", "response_mask", "loss_mask", "advantages"]
    assert only.advantages[:, 0].tolist() == [10.0, 2.0]
    with pytest.raises(ValueError, match="do not split over 3"):
        exp.split(3)


class FakeHandle:
    """A Ray actor handle stand-in: ``handle.method.remote(*args)`` runs ``method`` at once."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        method = getattr(self.worker, name)
        return type("Remote", (), {"remote": staticmethod(method)})


class FakeActorRank:
    """Records what it received; its engine samples deterministic responses (seed in the first token)."""

    def __init__(self, layout, tamper=False):
        self.lay, self.tamper, self.received = layout, tamper, []

    def generate(self, request, version=None):
        assert isinstance(request, RolloutRequest)  # the request crosses Ray as it is, not as a tuple
        prompts, n, seed, max_new_tokens = request.prompts, request.n, request.seed, request.max_new_tokens
        self.received.append(
            (prompts, n, seed)
            + ((max_new_tokens,) if max_new_tokens else ())
            + ((version,) if version is not None else ())
        )
        outs = [RolloutOutput(i // n, [seed + i], [-1.0], "stop") for i in range(len(prompts) * n)]
        digest = repr((prompts, n, seed + (1 if self.tamper else 0)))
        return RolloutResult(self.lay.rank, self.lay.engine, digest, outs if self.lay.engine_rank == 0 else None)

    def forward(self, rows, tag):
        self.received.append(rows)
        return ForwardAnswer(rows.input_ids[:, 0].clone() if self.lay.output else None, {"timing/" + tag: 1.0})

    def update(self, mini_batches, coef):
        self.received.append(mini_batches)
        return {"coef": coef}


def group_of(world, tp, engine_size, tamper_rank=None):
    """Ranks laid out as megatron does (TP fastest, then DP) with vLLM's contiguous engine blocks."""
    layouts, ranks = [], []
    for rank in range(world):
        lay = RankLayout(
            rank=rank,
            dp_rank=rank // tp,
            dp_size=world // tp,
            tp_rank=rank % tp,
            pp_rank=0,
            output=rank % tp == 0,
            engine=rank // engine_size,
            engine_rank=rank % engine_size,
            engine_size=engine_size,
        )
        layouts.append(lay)
        ranks.append(FakeActorRank(lay, tamper=rank == tamper_rank))
    return WorkerGroup("actor", [FakeHandle(r) for r in ranks], layouts), ranks


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(ray, "put", lambda value: value)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns=1, timeout=None: (list(refs), []))


@pytest.mark.parametrize("world,tp,engine_size", [(4, 2, 2), (4, 2, 1), (2, 1, 2), (8, 8, 8), (4, 1, 4)])
def test_generate_gives_every_rank_of_an_engine_the_same_prompts(world, tp, engine_size):
    group, ranks = group_of(world, tp, engine_size)
    prompts = [[p, p + 1] for p in range(6)]
    engines = group.engines()
    assert engines == [list(range(e, e + engine_size)) for e in range(0, world, engine_size)]
    got = group.generate(RolloutRequest(prompts, 2, 100))
    for members in engines:  # identical requests inside an engine
        assert all(ranks[r].received == ranks[members[0]].received for r in members)
    seen = [p for members in engines for p in ranks[members[0]].received[0][0]]
    assert seen == prompts  # every prompt once, engines in order
    # global prompt indices, and sample j of the iteration seeded 100 + j whatever the engine count
    by_prompt = sorted((o.prompt_index, o.response_ids[0]) for o in got.outputs)
    assert by_prompt == [(j // 2, 100 + j) for j in range(12)]


def test_generate_refuses_ranks_of_one_engine_that_disagree():
    group, _ = group_of(4, 2, 2, tamper_rank=3)
    with pytest.raises(DispatchError, match=r"engine 1: ranks \[2, 3\] received different requests"):
        group.generate(RolloutRequest([[1], [2], [3], [4]], 1, 0))


def test_forward_splits_rows_by_train_dp_and_gathers_from_output_ranks():
    group, ranks = group_of(4, 2, 2)  # TP 2 x DP 2
    prompts = [[p + 1] for p in range(4)]
    exp = build_experience(prompts, outputs_for(prompts, 2), 2, pad_id=0)
    answer = group.forward("forward", exp, ("input_ids", "attention_mask", "response_mask"), "ref")
    assert answer.per_row.tolist() == [1, 1, 2, 2, 3, 3, 4, 4] and answer.timing == {"timing/ref": 1.0}
    assert [len(r.received) for r in ranks] == [1, 1, 1, 1] and ranks[0].received[0].num_rows == 4
    assert torch.equal(ranks[0].received[0].input_ids, ranks[1].received[0].input_ids)  # one DP group
    assert not torch.equal(ranks[0].received[0].input_ids, ranks[2].received[0].input_ids)


def test_update_sends_each_dp_rank_its_share_with_the_whole_mini_batch_token_count():
    group, ranks = group_of(4, 2, 2)
    prompts = [[p + 1] for p in range(4)]
    exp = build_experience(prompts, outputs_for(prompts, 2), 2, pad_id=0)
    exp.set("advantages", torch.ones(8, exp.response_width))
    plan = [np.array([7, 0, 3, 4]), np.array([1, 2, 5, 6])]
    assert group.update("update", exp, plan, ["advantages"], 0.5, horizon=16) == {"coef": 0.5}
    first_dp, second_dp = ranks[0].received[0], ranks[2].received[0]
    assert all(isinstance(mb, MiniBatch) for mb in first_dp)
    for step, rows in enumerate(plan):
        scale = first_dp[step].scale
        assert scale == second_dp[step].scale
        assert scale.tokens == float(exp.response_mask[rows].sum()) and scale.horizon == 16
        assert scale.sequences == float((exp.response_mask[rows].sum(1) > 0).sum())
        got = torch.cat([first_dp[step].rows.input_ids, second_dp[step].rows.input_ids])
        assert torch.equal(got, exp.input_ids[rows])
    assert first_dp[0].rows.advantages is not None and first_dp[0].rows.old_log_probs is None


class TensorRank(FakeActorRank):
    """Answers with a tensor per row (its first prompt token) and the token count it received."""

    def forward(self, rows, tag):
        self.received.append(rows)
        return ForwardAnswer(rows.input_ids[:, -1].clone(), {"timing/" + tag: float(rows.attention_mask.sum())})


def test_dp_batch_balance_near_equal_tokens_and_rows_back_in_order():
    layouts = [RankLayout(rank=r, dp_rank=r, dp_size=2, tp_rank=0, pp_rank=0, output=True) for r in range(2)]
    ranks = [TensorRank(lay) for lay in layouts]
    group = WorkerGroup("actor", [FakeHandle(r) for r in ranks], layouts)
    lengths = [16, 1, 14, 2, 12, 3, 10, 4]  # contiguous halves: 33 vs 29 + ...; long rows first
    prompts = [[p + 1] for p in range(8)]
    outs = [RolloutOutput(p, list(range(100 + p, 100 + p + lengths[p])), [0.0] * lengths[p], "stop") for p in range(8)]
    exp = build_experience(prompts, outs, 1, pad_id=0)
    want = exp.input_ids[:, -1]
    plain = group.forward("forward", exp, ("input_ids", "attention_mask"), "ref")
    balanced = group.forward("forward", exp, ("input_ids", "attention_mask"), "ref", balance=True)
    assert torch.equal(plain.per_row, want) and torch.equal(balanced.per_row, want)  # rows back in order

    def spread(answers):
        return abs(ranks[0].received[-1].attention_mask.sum() - ranks[1].received[-1].attention_mask.sum())

    # timings: the slowest DP group's (here its token count)
    assert plain.timing["timing/ref"] == max(int(exp.attention_mask[:4].sum()), int(exp.attention_mask[4:].sum()))
    assert spread(balanced) <= 2 and [r.received[-1].num_rows for r in ranks] == [4, 4]
    exp.set("advantages", torch.ones(8, exp.response_width))
    group.update("update", exp, [np.arange(8)], ["advantages"], 0.5, balance=True)
    first, second = ranks[0].received[-1][0], ranks[1].received[-1][0]
    assert first.scale == second.scale and first.scale.tokens == float(exp.response_mask.sum())
    assert first.rows.num_rows == second.rows.num_rows == 4
    assert abs(int(first.rows.attention_mask.sum()) - int(second.rows.attention_mask.sum())) <= 2


def test_generate_splits_per_prompt_budgets_with_the_prompts():
    group, ranks = group_of(4, 1, 2)  # 2 engines of 2 ranks
    prompts = [[p + 1] for p in range(4)]
    group.generate(RolloutRequest(prompts, 2, 100, max_new_tokens=[5, 6, 7, 8]))
    assert ranks[0].received[-1] == ([[1], [2]], 2, 100, [5, 6]) == ranks[1].received[-1]
    assert ranks[2].received[-1] == ([[3], [4]], 2, 104, [7, 8])


def test_prompt_batch_reads_budgets_when_the_dataset_has_them():
    from mindspeed_rl.datasets.prompt_dataset import PromptBatch

    data = [
        {"input_ids": [1, 2], "labels": "7", "max_new_tokens": "12"},
        {"input_ids": [3], "labels": "8", "max_new_tokens": "40"},
    ]
    batch = PromptBatch.of(data, [1, 0])
    assert batch.input_ids == [[3], [1, 2]] and batch.max_new_tokens == [40, 12]
    assert PromptBatch.of([{"input_ids": [1], "labels": "x"}], [0]).max_new_tokens is None


def test_colocated_rollout_service_submits_with_the_policy_version():
    from mindspeed_rl.rollout.service import ColocatedRollout

    group, ranks = group_of(4, 2, 2)
    service = ColocatedRollout(group)
    service.update_weights(3)
    handle = service.submit(RolloutRequest([[1], [2]], 1, 50, max_new_tokens=[4, 5]))
    assert handle.version == 3
    batch = service.collect(handle)
    assert sorted((o.prompt_index, o.response_ids) for o in batch.outputs) == [(0, [50]), (1, [51])]
    assert ranks[0].received[-1] == ([[1]], 1, 50, [4], 3) and ranks[2].received[-1] == ([[2]], 1, 51, [5], 3)
