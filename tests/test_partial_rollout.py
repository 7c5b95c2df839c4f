"""Partial rollout's pool and rounds (rollout/partial.py) against a scripted engine: chunking, parking,
per-token versions, the max-age rule, oldest groups first, and an exact resume from the pool's state."""

import copy

import pytest

from mindspeed_rl.protocol import RolloutOutput, build_experience
from mindspeed_rl.rollout.partial import PartialRollout


class ScriptedEngine:
    """Response length of each prompt comes from a table keyed by its first token; a response stops
    (finish "stop") when it reaches that length. Token t of a response is 1000 + t; log-prob -t/100."""

    def __init__(self, lengths):
        self.lengths, self.calls = lengths, []

    def __call__(self, request):
        self.calls.append(request)
        outs = []
        for j, (prompt, cap) in enumerate(zip(request.prompts, request.max_new_tokens)):
            want = self.lengths[prompt[0]]
            done = len(prompt) - 1  # prompts are one token long
            take = min(cap, want - done)
            ids = [1000 + done + t for t in range(take)]
            outs.append(
                RolloutOutput(
                    j, ids, [-(done + t) / 100 for t in range(take)], "stop" if done + take >= want else "length"
                )
            )
        return outs


def drawer(lengths):
    """Draw prompts in table order, two per call (a global batch of 2 prompts)."""
    order = iter(sorted(lengths))

    def draw():
        prompts = [[next(order)] for _ in range(2)]
        return prompts, [f"label{p[0]}" for p in prompts], None

    return draw


def test_long_responses_are_parked_and_continued_with_the_next_version():
    lengths = {0: 3, 1: 20, 2: 2, 3: 4, 4: 5, 5: 6}
    engine = ScriptedEngine(lengths)
    pool = PartialRollout(n=1, max_tokens=20, max_split=4)  # chunks of 5 tokens
    draw = drawer(lengths)
    first = pool.next_batch(2, draw, engine, version=0, round_seed=lambda r: 100 + r)
    # round 0: prompts 0 (3 tokens, done) and 1 (5 of 20); the pool cannot fill 2 groups, so 2 and 3 join
    assert [p[0] for p in first.prompts] == [0, 2]
    assert first.metrics["partial_rollout/drawn_prompts"] == 4.0
    parked = {t.prompt[0]: t for t in pool.pool}
    assert set(parked) == {1, 3} and len(parked[1].response_ids) == 10 and parked[1].versions == [0] * 10
    assert parked[3].finished and parked[3].age == 1  # finished but not needed: waits, one version old
    second = pool.next_batch(2, draw, engine, version=1, round_seed=lambda r: 200 + r)
    assert [p[0] for p in second.prompts] == [3, 4]  # oldest finished group first
    third = pool.next_batch(2, draw, engine, version=2, round_seed=lambda r: 300 + r)
    out = dict(zip([p[0] for p in third.prompts], third.outputs))
    long = out[1]
    assert long.response_ids == [1000 + t for t in range(20)] and long.finish_reason == "stop"
    assert long.versions[:10] == [0] * 10 and set(long.versions[10:]) <= {1, 2}  # per-token versions
    assert all(c.max_new_tokens and max(c.max_new_tokens) <= 5 for c in engine.calls)


def test_every_response_finishes_within_max_split_iterations():
    lengths = {p: (40 if p % 3 == 0 else 2) for p in range(60)}
    pool = PartialRollout(n=2, max_tokens=40, max_split=4)
    engine, draw = ScriptedEngine(lengths), drawer(lengths)
    long_done = 0
    for version in range(10):
        batch = pool.next_batch(2, draw, engine, version, round_seed=lambda r: r)
        assert len(batch.outputs) == 4 and all(o.finish_reason == "stop" for o in batch.outputs)
        long_done += sum(len(o.response_ids) == 40 for o in batch.outputs)
        assert all(t.age <= 3 for t in pool.pool if not t.finished)
    assert long_done >= 4


def test_require_max_age_all_finished_keeps_generating_until_the_oldest_finish():
    lengths = {0: 12, 1: 1, 2: 1, 3: 1}
    # with the rule the oldest response finishes and, being the oldest group, trains now; without it the
    # finished group trains and the oldest stays parked
    for require, rounds, trained in ((True, 2, [[0]]), (False, 0, [[1]])):
        pool = PartialRollout(n=1, max_tokens=12, max_split=3, require_max_age_all_finished=require)
        engine = ScriptedEngine(lengths)
        pool.add_prompts([[0], [1]], ["a", "b"])
        pool.run_round(engine, seed=0, version=0)  # 0 has 4 of 12 tokens, 1 has finished
        pool.pool[0].age = 2  # as if parked twice: the maximum age
        batch = pool.next_batch(1, drawer(lengths), engine, 1, round_seed=lambda r: r)
        assert batch.metrics["partial_rollout/rounds"] == rounds and batch.prompts == trained
        assert [(t.prompt, t.age) for t in pool.pool] == ([([1], 1)] if require else [([0], 3)])


def test_the_pool_state_resumes_exactly():
    lengths = {p: (17 if p % 2 else 3) for p in range(40)}
    straight = PartialRollout(n=2, max_tokens=17, max_split=3)
    engine, draw = ScriptedEngine(lengths), drawer(lengths)
    results = [straight.next_batch(2, draw, engine, v, round_seed=lambda r: r).outputs for v in range(3)]
    saved = copy.deepcopy(straight.state_dict())
    results += [straight.next_batch(2, draw, engine, v, round_seed=lambda r: r).outputs for v in range(3, 5)]

    resumed = PartialRollout(n=2, max_tokens=17, max_split=3)
    resumed.load_state_dict(saved)
    engine2, draw2 = ScriptedEngine(lengths), drawer(lengths)
    for _ in range(3):  # the sampler's position comes from its own state in the trainer
        draw2()
    again = [resumed.next_batch(2, draw2, engine2, v, round_seed=lambda r: r).outputs for v in range(3, 5)]
    assert again == results[3:]
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        PartialRollout(n=4, max_tokens=17, max_split=3).load_state_dict(saved)


def test_experience_carries_each_token_version():
    outs = [
        RolloutOutput(0, [5, 6, 7], [-0.1, -0.2, -0.3], "stop", versions=[2, 3, 3]),
        RolloutOutput(1, [8], [-0.5], "length"),
    ]
    exp = build_experience([[1], [2]], outs, 1, pad_id=0, version=3)
    assert exp.policy_version.tolist() == [[2, 3, 3], [3, 0, 0]]
    assert exp.loss_mask.tolist() == exp.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
