"""The asynchronous rollout pipeline against a fake service: batches are submitted ahead with the version of
their submission, taken in order, and a checkpoint of the queue restores the same samples."""

import copy

import pytest

from mindspeed_rl.protocol import GeneratedBatch, RolloutOutput, RolloutRequest
from mindspeed_rl.rollout.pipeline import RolloutPipeline
from mindspeed_rl.rollout.service import RolloutHandle, RolloutService
from mindspeed_rl.trainer.prompts import PromptBatch


class FakeService(RolloutService):
    """Generates one token per prompt: its seed plus 1000 x the version; counts what is in flight."""

    def __init__(self):
        super().__init__()
        self.submitted, self.collected = [], []

    def submit(self, request):
        self.submitted.append((request.seed, self.version))
        return RolloutHandle(request, self.version, (request, self.version))

    def collect(self, handle):
        request, version = handle.pending
        self.collected.append(request.seed)
        outs = [
            RolloutOutput(i, [request.seed + i + 1000 * version], [-0.5], "stop") for i in range(len(request.prompts))
        ]
        return GeneratedBatch(outs, {"timing/generate": 1.0}, [])


def make_request(iteration):
    prompts = PromptBatch([[iteration]], [str(iteration)])
    return prompts, RolloutRequest(prompts.input_ids, 1, 100 * iteration)


def test_batches_run_ahead_by_the_lag_and_keep_their_submission_version():
    service = FakeService()
    pipeline = RolloutPipeline(service, max_head_offpolicyness=2)
    for k in range(4):
        pipeline.fill(k, make_request)
        entry, _ = pipeline.take(k)
        assert entry.iteration == k and entry.prompts.input_ids == [[k]]
        assert k - entry.version == min(k, 2)  # sampled 2 versions before it trains (fewer at the start)
        service.update_weights(k + 1)
    assert service.submitted[:3] == [(0, 0), (100, 0), (200, 0)] and service.submitted[3] == (300, 1)
    with pytest.raises(RuntimeError, match="no batch submitted for iteration 9"):
        pipeline.take(9)


def test_a_checkpoint_of_the_queue_restores_the_same_samples():
    service = FakeService()
    pipeline = RolloutPipeline(service, max_head_offpolicyness=1)
    pipeline.fill(0, make_request)
    pipeline.take(0)
    service.update_weights(1)
    state = copy.deepcopy(pipeline.state_dict())  # waits for batch 1 (in flight)
    assert [b["iteration"] for b in state] == [1] and state[0]["version"] == 0
    straight, _ = pipeline.take(1)

    resumed = RolloutPipeline(FakeService(), max_head_offpolicyness=1)
    resumed.load_state_dict(state, PromptBatch)
    again, _ = resumed.take(1)
    assert again.result.outputs == straight.result.outputs and again.version == straight.version == 0
    assert again.prompts == straight.prompts and again.request == straight.request
