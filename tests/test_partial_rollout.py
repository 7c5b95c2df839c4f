"""Partial rollout: the rollout source with the Chunked schedule (single turn, every group kept) against a
scripted engine: chunking, parking, per-token versions, the max-age rule, oldest groups first, and an exact
resume from the source's state."""

import json

import pytest
import torch

from mindspeed_rl.datasets.prompt_dataset import PromptBatch
from mindspeed_rl.protocol import GeneratedBatch, RolloutOutput, build_experience
from mindspeed_rl.rollout.service import RolloutHandle, RolloutService
from mindspeed_rl.rollout.source.agent_loop import AgentContext, SingleTurn
from mindspeed_rl.rollout.source.group_filter import KeepAll
from mindspeed_rl.rollout.source.rollout_source import RolloutSource
from mindspeed_rl.rollout.source.schedules import Chunked
from mindspeed_rl.rollout.source.trajectory import FINISHED
from mindspeed_rl.utils.clock import Clock
from tests.rollout_fakes import TOK


class ScriptedEngine(RolloutService):
    """Response length of each prompt comes from a table keyed by its first token (prompts are one token
    long); a response stops (finish "stop") when it reaches that length. Token t of a response is 1000 + t,
    its log-prob -t/100 - version/1000. Records every request."""

    def __init__(self, lengths):
        super().__init__()
        self.lengths, self.requests = lengths, []

    def submit(self, request):
        self.requests.append(request)
        outs = []
        for j, (prompt, cap) in enumerate(zip(request.prompts, request.max_new_tokens)):
            want, done = self.lengths[prompt[0]], len(prompt) - 1
            take = min(cap, want - done)
            ids = [1000 + done + t for t in range(take)]
            logprobs = [-(done + t) / 100 - self.version / 1000 for t in range(take)]
            outs.append(RolloutOutput(j, ids, logprobs, "stop" if done + take >= want else "length"))
        return RolloutHandle(request, self.version, outs)

    def collect(self, handle):
        return GeneratedBatch(handle.pending, {}, [])


class Drawer:
    """Prompts in table order, two per draw (a global batch of 2 prompts); its position is the sampler's state."""

    def __init__(self, lengths, per_draw=2):
        self.order, self.per_draw, self.consumed = sorted(lengths), per_draw, 0

    def __call__(self):
        prompts = [[p] for p in self.order[self.consumed : self.consumed + self.per_draw]]
        self.consumed += self.per_draw
        return PromptBatch(prompts, [f"label{p[0]}" for p in prompts])


def zero_score(exp, clock):
    exp.set("scores", torch.zeros(exp.num_rows))
    return {}, {}


def source_of(engine, draw, n, max_tokens, max_split, want=2, require=True):
    return RolloutSource(
        engine, SingleTurn(AgentContext(None, TOK)), KeepAll(want), Chunked(max_tokens, max_split, require), draw,
        zero_score, n, max_tokens, 11, 0,
    )  # fmt: skip


def batch_at(source, version):
    """The batch of iteration ``version`` with the weights of that version (one update per iteration)."""
    source.service.update_weights(version)
    return source.next_batch(version)


def prompts_of(exp):
    return exp.input_ids[:, exp.prompt_width - 1].tolist()


def responses(exp):
    """Each row's response tokens and their versions."""
    rows = []
    for r in range(exp.num_rows):
        shown = exp.response_mask[r].bool()
        rows.append((exp.response_ids[r][shown].tolist(), exp.policy_version[r][shown].tolist()))
    return rows


def test_long_responses_are_parked_and_continued_with_the_next_version():
    lengths = {0: 3, 1: 20, 2: 2, 3: 4, 4: 5, 5: 6}
    engine = ScriptedEngine(lengths)
    source = source_of(engine, Drawer(lengths), n=1, max_tokens=20, max_split=4)  # chunks of 5 tokens
    first = batch_at(source, 0)
    # round 0: prompts 0 (3 tokens, done) and 1 (5 of 20); the pool cannot fill 2 groups, so 2 and 3 join
    assert prompts_of(first.experience) == [0, 2]
    assert first.metrics["partial_rollout/drawn_prompts"] == 4.0 and first.metrics["partial_rollout/rounds"] == 2.0
    assert first.metrics["partial_rollout/parked"] == 1.0 and first.metrics["partial_rollout/finished_waiting"] == 1.0
    parked = {t.prompt[0]: t for t in source.pool.trajectories}
    assert set(parked) == {1, 3} and len(parked[1].tokens) == 10 and parked[1].versions == [0] * 10
    assert not parked[1].done and parked[1].age == 1
    assert parked[3].done and parked[3].age == 1  # finished but not needed: waits, one version old
    second = batch_at(source, 1)
    assert prompts_of(second.experience) == [3, 4]  # oldest finished group first
    assert second.metrics["partial_rollout/carried_share"] == 0.5  # prompt 3 waited one iteration
    third = batch_at(source, 2)
    assert prompts_of(third.experience) == [1, 5]
    (long_ids, long_versions), (rest_ids, rest_versions) = responses(third.experience)
    assert long_ids == [1000 + t for t in range(20)]
    assert long_versions == [0] * 10 + [1] * 5 + [2] * 5  # per-token versions
    assert third.experience.rollout_log_probs[0, :20].tolist() == pytest.approx(
        [-t / 100 - v / 1000 for t, v in zip(range(20), long_versions)]
    )
    assert rest_ids == [1000 + t for t in range(6)] and rest_versions == [1] * 5 + [2]
    assert third.metrics["partial_rollout/max_age"] == 2.0
    assert all(r.n == 1 and max(r.max_new_tokens) <= 5 for r in engine.requests)
    assert source.pool.trajectories == []


def test_every_response_finishes_within_max_split_iterations():
    lengths = {p: (40 if p % 3 == 0 else 2) for p in range(60)}
    max_split = 4
    source = source_of(ScriptedEngine(lengths), Drawer(lengths), n=2, max_tokens=40, max_split=max_split)
    long_done = 0
    for version in range(10):
        exp = batch_at(source, version).experience
        assert exp.num_rows == 4
        for prompt, (ids, versions) in zip(prompts_of(exp), responses(exp)):
            assert len(ids) == lengths[prompt]  # the whole scripted response: it stopped on its own
            assert min(versions) >= version - (max_split - 1)  # at most max_split - 1 versions old
        long_done += sum(len(ids) == 40 for ids, _ in responses(exp))
        assert all(t.age <= max_split - 1 for t in source.pool.trajectories if not t.done)
    assert long_done >= 4


@pytest.mark.parametrize("require", [True, False])
def test_require_max_age_all_finished_keeps_generating_until_the_oldest_finish(require):
    lengths = {0: 12, 1: 1, 2: 1, 3: 1}
    engine = ScriptedEngine(lengths)
    source = source_of(engine, Drawer(lengths), n=1, max_tokens=12, max_split=3, want=1, require=require)
    source.pool.add(PromptBatch([[0], [1]], ["a", "b"]))
    source.pool.run_round(engine, 0, 0, source.schedule.chunk, Clock())  # 0 has 4 of 12 tokens, 1 has finished
    source.pool.trajectories[0].age = 2  # as if parked twice: the maximum age
    batch = batch_at(source, 1)
    if require:  # two more rounds: the oldest response finishes with the new version and trains first
        assert batch.metrics["partial_rollout/rounds"] == 2 and batch.metrics["partial_rollout/drawn_prompts"] == 0
        assert prompts_of(batch.experience) == [0] and responses(batch.experience)[0][1] == [0] * 4 + [1] * 8
        assert [(t.prompt, t.status) for t in source.pool.trajectories] == [([1], FINISHED)]
    else:  # the finished group trains, the oldest stays parked
        assert batch.metrics["partial_rollout/rounds"] == 0 and prompts_of(batch.experience) == [1]
        assert [(t.prompt, t.age, t.done, len(t.tokens)) for t in source.pool.trajectories] == [([0], 3, False, 4)]


def test_with_require_max_age_all_finished_the_oldest_trains_within_max_split_iterations():
    """Prompt 0 is long (3 chunks), 1-3 are short; one group per batch. The oldest response finishes and trains at
    iteration max_split - 1, ahead of group 3 that finished earlier and waits (a finished group's wait is not
    bounded by the rule: MindSpeed-RL's require_max_age_all_finished concerns unfinished responses)."""
    lengths = {0: 12, 1: 1, 2: 1, 3: 1}
    source = source_of(ScriptedEngine(lengths), Drawer(lengths, 4), n=1, max_tokens=12, max_split=3, want=1)
    trained = []
    for version in range(4):
        exp = batch_at(source, version).experience
        trained += prompts_of(exp)
        if prompts_of(exp) == [0]:
            assert version == 2 and responses(exp)[0][1] == [0] * 4 + [2] * 8
    assert trained == [1, 2, 0, 3]


def test_the_pool_state_resumes_exactly():
    lengths = {p: (17 if p % 2 else 3) for p in range(40)}

    def fingerprint(batch):
        exp = batch.experience
        return (exp.input_ids.tolist(), exp.policy_version.tolist(), exp.rollout_log_probs.tolist(),
                exp.response_mask.tolist())  # fmt: skip

    draw = Drawer(lengths)
    straight = source_of(ScriptedEngine(lengths), draw, n=2, max_tokens=17, max_split=3)
    results = [fingerprint(batch_at(straight, v)) for v in range(3)]
    saved = json.loads(json.dumps(straight.state_dict()))  # what a checkpoint stores, through a file format
    consumed = draw.consumed
    results += [fingerprint(batch_at(straight, v)) for v in range(3, 5)]
    assert saved["pool"]["trajectories"] and any(t["status"] == "interrupted" for t in saved["pool"]["trajectories"])

    draw2 = Drawer(lengths)
    draw2.consumed = consumed  # the sampler's position comes from its own state in the trainer
    resumed = source_of(ScriptedEngine(lengths), draw2, n=2, max_tokens=17, max_split=3)
    resumed.load_state_dict({"rollout_source": saved})
    again = [fingerprint(batch_at(resumed, v)) for v in range(3, 5)]
    assert again == results[3:]
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        source_of(ScriptedEngine(lengths), Drawer(lengths), n=4, max_tokens=17, max_split=3).load_state_dict(
            {"rollout_source": saved}
        )


def test_experience_carries_each_token_version():
    outs = [
        RolloutOutput(0, [5, 6, 7], [-0.1, -0.2, -0.3], "stop", versions=[2, 3, 3]),
        RolloutOutput(1, [8], [-0.5], "length"),
    ]
    exp = build_experience([[1], [2]], outs, 1, pad_id=0, version=3)
    assert exp.policy_version.tolist() == [[2, 3, 3], [3, 0, 0]]
    assert exp.loss_mask.tolist() == exp.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
