"""Asynchronous rollout: the rollout source with the Ahead schedule against a fake service: batches are produced
ahead by the lag with the version of their production, taken in order, and a checkpoint of the queue restores
the same samples."""

import json

import pytest
import torch

from mindspeed_rl.datasets.prompt_dataset import PromptBatch
from mindspeed_rl.protocol import GeneratedBatch, RolloutOutput
from mindspeed_rl.rollout.service import RolloutHandle, RolloutService
from mindspeed_rl.rollout.source.agent_loop import AgentContext, SingleTurn
from mindspeed_rl.rollout.source.group_filter import KeepAll
from mindspeed_rl.rollout.source.rollout_source import RolloutSource, SeedStream
from mindspeed_rl.rollout.source.schedules import Ahead, Synchronous
from tests.rollout_fakes import TOK

SEED = 5


class FakeService(RolloutService):
    """Answers each row with one token: its prompt's token plus 1000 x the version (log-prob -seed/2**32);
    records (seed, version) of every request."""

    def __init__(self):
        super().__init__()
        self.submitted = []

    def submit(self, request):
        self.submitted.append((request.seed, self.version))
        outs = [
            RolloutOutput(j, [p[0] + 1000 * self.version], [-(request.seed + j) / 2**32], "stop")
            for j, p in enumerate(request.prompts)
        ]
        return RolloutHandle(request, self.version, outs)

    def collect(self, handle):
        return GeneratedBatch(handle.pending, {"timing/generate": 1.0}, [])


class Draws:
    """Draw k is the one prompt [k]; its position is the sampler's state."""

    def __init__(self, consumed=0):
        self.consumed = consumed

    def __call__(self):
        self.consumed += 1
        return PromptBatch([[self.consumed - 1]], [str(self.consumed - 1)])


def zero_score(exp, clock):
    exp.set("scores", torch.zeros(exp.num_rows))
    return {}, {}


def source_of(service, lag, draws=None):
    return RolloutSource(
        service, SingleTurn(AgentContext(None, TOK)), KeepAll(1), Synchronous(8), draws or Draws(), zero_score, 1,
        8, SEED, 0, Ahead(lag),
    )  # fmt: skip


def train(source, iteration):
    """The trainer's iteration: take the batch, wait for the productions in flight, update the weights."""
    batch = source.next_batch(iteration)
    source.settle()
    source.service.update_weights(iteration + 1)
    return batch


def sample(batch):
    exp = batch.experience
    return (exp.input_ids.tolist(), exp.policy_version.tolist(), exp.rollout_log_probs.tolist())


def test_batches_run_ahead_by_the_lag_and_keep_their_production_version():
    service, lag = FakeService(), 2
    source = source_of(service, lag)
    for k in range(4):
        batch = train(source, k)
        exp = batch.experience
        version = max(0, k - lag)  # produced lag versions before it trains (fewer at the start)
        assert exp.input_ids[0, exp.prompt_width - 1] == k and exp.response_ids.tolist() == [[k + 1000 * version]]
        assert exp.policy_version.tolist() == [[version]]
        assert 0.0 <= batch.metrics["async/overlap_share"] <= 1.0 and "timing/rollout_wait" in batch.clock.timing
        assert len(service.submitted) == k + lag + 1  # the batches up to k + lag are produced
    start = SeedStream(SEED, "train").start  # one row per batch: consecutive seeds
    assert service.submitted == [(start + j, max(0, j - lag)) for j in range(4 + lag)]
    with pytest.raises(RuntimeError, match="no batch for iteration 9"):
        source.next_batch(9)
    source.settle()


def test_a_checkpoint_of_the_queue_restores_the_same_samples():
    draws = Draws()
    straight = source_of(FakeService(), 1, draws)
    train(straight, 0)
    state = json.loads(json.dumps(straight.state_dict()))  # waits for batch 1 (in flight), through a file format
    assert [b["iteration"] for b in state["ahead"]] == [1] and state["ahead"][0]["version"] == 0
    consumed = draws.consumed
    expected = [sample(train(straight, k)) for k in (1, 2)]

    service = FakeService()
    service.update_weights(1)  # the resumed run's weights: those of the checkpoint
    resumed = source_of(service, 1, Draws(consumed))
    resumed.load_state_dict({"rollout_source": state})
    again = [sample(train(resumed, k)) for k in (1, 2)]
    assert again == expected and again[0][1] == [[0]]
    start = SeedStream(SEED, "train").start  # the resumed stream continues after the 2 seeds used before
    assert [seed for seed, _ in service.submitted] == [start + 2, start + 3]
