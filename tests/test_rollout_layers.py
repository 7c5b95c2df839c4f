"""The rollout source's three layers (rollout function x group filter x schedule) on a scripted service:
every combination produces whole batches with per-token versions and masked tool results; tools run while
the next round generates without changing what is generated; each layer's state and the four-way source's
state resume into exactly the batches of an uninterrupted run."""

import functools
import itertools
import json
import pickle
import time

import pytest

from mindspeed_rl.datasets.prompt_dataset import PromptBatch
from mindspeed_rl.rollout.source.agent_loop import AgentContext, SingleTurn, ToolAgent
from mindspeed_rl.rollout.source.group_filter import DynamicSampling, KeepAll
from mindspeed_rl.rollout.source.rollout_source import Produced, RolloutSource
from mindspeed_rl.rollout.source.rounds import TrajectoryPool
from mindspeed_rl.rollout.source.schedules import Ahead, Chunked, Synchronous
from mindspeed_rl.rollout.source.trajectory import FINISHED, Trajectory
from mindspeed_rl.utils.clock import Clock
from tests.rollout_fakes import TOK, Draws, InProcessSandbox, ScriptedService, score, tool_context

N, WANT, MAX_TOKENS = 4, 2, 320


def make_source(function="tool_agent", ds=False, split=1, lag=0, sandbox=None, service=None, draws=None):
    fn = ToolAgent(tool_context(sandbox)) if function == "tool_agent" else SingleTurn(AgentContext(None, TOK))
    flt = DynamicSampling(WANT, "acc", 4) if ds else KeepAll(WANT)
    schedule = Chunked(MAX_TOKENS, split) if split > 1 else Synchronous(MAX_TOKENS)
    return RolloutSource(
        service or ScriptedService(), fn, flt, schedule, draws or Draws(), score, N, MAX_TOKENS, 7, 0,
        Ahead(lag) if lag else None,
    )  # fmt: skip


def run(source, iterations, start=0):
    """Batches of ``iterations`` iterations, the weights updated after each as the trainer does."""
    out = []
    for it in range(start, start + iterations):
        batch = source.next_batch(it)
        source.settle()
        source.service.update_weights(it + 1)
        out.append((batch, it))
    return out


def fingerprint(batch):
    exp = batch.experience
    return (
        exp.input_ids.tolist(), exp.loss_mask.tolist(), exp.policy_version.tolist(),
        exp.rollout_log_probs.tolist(), exp.scores.tolist(),
    )  # fmt: skip


COMBINATIONS = list(itertools.product(("single_turn", "tool_agent"), (False, True), (1, 4), (0, 1)))


@pytest.mark.parametrize("function,ds,split,lag", COMBINATIONS)
def test_every_combination_gives_whole_batches_with_bounded_staleness(function, ds, split, lag):
    source = make_source(function, ds, split, lag)
    for batch, it in run(source, 4):
        exp = batch.experience
        assert exp.num_rows == WANT * N and exp.group.tolist() == [g for g in range(WANT) for _ in range(N)]
        generated = exp.loss_mask.bool()
        versions = exp.policy_version[generated]
        # tokens never come from weights newer than the iteration's; partial rollout may carry them longer
        assert int(versions.max()) <= it
        oldest = it - lag - (split - 1 if split > 1 else 0)
        assert int(versions.min()) >= max(0, oldest), (it, versions.unique().tolist())
        if function == "tool_agent":
            tool_tokens = exp.response_mask.bool() & ~generated
            assert float(exp.rollout_log_probs[tool_tokens].abs().sum()) == 0.0
        if ds:
            assert batch.metrics["dynamic_sampling/batches"] >= 0
            kept = batch.metrics["dynamic_sampling/kept_groups"]
            for g in range(int(kept)):  # informative groups first: their scores differ
                assert exp.scores[g * N : (g + 1) * N].unique().numel() > 1
        if lag:
            assert 0.0 <= batch.metrics["async/overlap_share"] <= 1.0


def test_the_tool_agent_under_partial_rollout_continues_turns_and_tools_across_iterations():
    """A trajectory parked mid-turn continues with the next weights: its tokens carry both versions, its
    tool result stays loss-masked with log-prob 0, and its turns read as one conversation."""
    continued = 0
    for batch, _ in run(make_source("tool_agent", split=4), 4):
        exp = batch.experience
        for row in range(exp.num_rows):
            shown = exp.response_mask[row].bool()
            text = TOK.decode(exp.response_ids[row][shown].tolist())
            mask = exp.loss_mask[row][shown].tolist()
            if len(set(exp.policy_version[row][shown].tolist())) > 1:
                continued += 1
            if "<tool_response>" in text:
                start, end = text.index("<tool_response>"), text.index("</tool_response>")
                assert set(mask[start:end]) == {0} and mask[0] == 1
                assert set(exp.rollout_log_probs[row][shown][start:end].tolist()) == {0.0}
                assert "#### " in text[end:]  # the next turn answers with the result
    assert continued > 0


def test_tools_run_while_the_next_round_generates_and_never_change_what_is_generated():
    slow, fast = InProcessSandbox(delay=0.2), InProcessSandbox()
    runs = []
    for sandbox in (slow, fast):
        service = ScriptedService()
        submitted = []
        original = service.submit

        def submit(request, original=original, submitted=submitted):
            submitted.append(time.perf_counter())
            return original(request)

        service.submit = submit
        source = make_source("tool_agent", split=4, sandbox=sandbox, service=service)
        runs.append(([fingerprint(b) for b, _ in run(source, 2)], submitted))
    assert runs[0][0] == runs[1][0]  # a slow tool changes timing only
    overlapped = [any(a < s < b for s in runs[0][1]) for a, b in slow.windows]
    assert any(overlapped), "no round was submitted while a tool ran"


@pytest.mark.parametrize("lag,stop", [(0, 3), (1, 2)])
def test_the_four_way_source_resumes_into_the_straight_runs_batches(lag, stop):
    """Tool agent x dynamic sampling x partial chunks (x batches ahead): stopped after ``stop`` iterations (a
    point where trajectories are parked), saved through JSON, resumed in a fresh source: the same batches."""
    straight = [fingerprint(b) for b, _ in run(make_source("tool_agent", True, 4, lag), 5)]
    draws = Draws()
    first = make_source("tool_agent", True, 4, lag, draws=draws)
    head = [fingerprint(b) for b, _ in run(first, stop)]
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores, through a file format
    assert state["pool"]["trajectories"], "nothing parked: the test would not test the pool"
    assert [p["iteration"] for p in state.get("ahead", [])] == list(range(stop, stop + lag))
    resumed_draws, resumed_service = Draws(), ScriptedService()
    resumed_draws.consumed = draws.consumed
    resumed_service.update_weights(stop)
    second = make_source("tool_agent", True, 4, lag, service=resumed_service, draws=resumed_draws)
    second.load_state_dict({"rollout_source": state})
    tail = [fingerprint(b) for b, _ in run(second, 5 - stop, start=stop)]
    assert head + tail == straight


def test_each_layers_state_round_trips():
    traj = Trajectory(5, [1, 2], "6", 10, ["calculator"], [3], [-0.5], [1], [2], FINISHED, "stop", 1, 0, 1,
                      {"error": 1}, 0, 2, 1.0, {"acc": 1.0})  # fmt: skip
    assert Trajectory.from_state(json.loads(json.dumps(traj.state()))) == traj
    flt = DynamicSampling(2, "acc", 3)
    flt.offer([traj, Trajectory.from_state({**traj.state(), "uid": 6, "score": 0.0, "verifier_scores": {"acc": 0.0}})])
    flt.offer([traj, traj])
    again = DynamicSampling(2, "acc", 3)
    again.load_state_dict(json.loads(json.dumps(flt.state_dict())))
    assert again.kept == flt.kept and again.dropped == flt.dropped and len(again.kept) == 1
    produced = Produced(3, 1, [[traj]], {"x": 1.0}, Clock(), 0.5)
    assert Produced.from_state(json.loads(json.dumps(produced.state()))).groups == [[traj]]
    pool = TrajectoryPool(SingleTurn(AgentContext(None, TOK)), 2, 8)
    pool.add(PromptBatch([[1], [2]], ["a", "b"], [4, 9]))
    copy = TrajectoryPool(SingleTurn(AgentContext(None, TOK)), 2, 8)
    copy.load_state_dict(json.loads(json.dumps(pool.state_dict())))
    assert copy.trajectories == pool.trajectories and [t.budget for t in copy.trajectories] == [4, 4, 8, 8]
    with pytest.raises(ValueError, match="groups of 2 responses"):
        TrajectoryPool(SingleTurn(AgentContext(None, TOK)), 3, 8).load_state_dict(pool.state_dict())


def test_a_checkpoint_of_the_old_partial_pool_and_async_queue_resumes():
    source = make_source("single_turn", split=4, lag=1)
    legacy = {
        "partial_rollout": {
            "n": N, "next_uid": 8,
            "pool": [
                {"uid": 4, "prompt": [1], "label": "6", "budget": 9, "response_ids": [5], "logprobs": [-1.0],
                 "versions": [0], "finished": False, "finish_reason": "length", "age": 1},
            ],
        },
        "async_rollout": [
            {"iteration": 2, "version": 1, "prompts": {"input_ids": [[1]] * WANT, "labels": ["6"] * WANT,
             "max_new_tokens": None, "tools": None}, "request": {},
             "outputs": [{"prompt_index": i // N, "response_ids": [7, 8], "logprobs": [-0.1, -0.2],
                          "finish_reason": "stop", "versions": None, "loss_mask": None} for i in range(WANT * N)],
             "timing": {}},
        ],
    }  # fmt: skip
    source.load_state_dict(legacy)
    assert source.pool.trajectories[0].tokens == [5] and not source.pool.trajectories[0].done
    batch = source.next_batch(2)
    assert batch.experience.num_rows == WANT * N and batch.experience.policy_version[0, :2].tolist() == [1, 1]
    assert batch.experience.scores.tolist() == [0.0] * (WANT * N)  # scored on the way out


def test_a_synchronous_batch_takes_groups_in_draw_order_not_the_quickest():
    """Synchronous: of 4 groups drawn for a batch of 2, the first two drawn train although the last two answer at
    once and the first two take a tool turn (dynamic sampling would otherwise select against tool use)."""
    from tests.rollout_fakes import continue_text

    class ToolsFirst(ScriptedService):
        """Prompts with 9 answer at once (tag A), the others call the calculator (tag C)."""

        def continue_text(self, context, seed):
            return continue_text(context, seed, "A" if "Q: 9" in context else "C")

    class Four:
        def __call__(self):
            rows = [("Q: 2*3?", "6"), ("Q: 3*4?", "12"), ("Q: 9*2?", "18"), ("Q: 9*3?", "27")]
            return PromptBatch([TOK.encode(q) for q, _ in rows], [a for _, a in rows])

    source = make_source("tool_agent", service=ToolsFirst(), draws=Four())
    exp = source.next_batch(0).experience
    prompts = [exp.input_ids[g * N, : exp.prompt_width][exp.prompt_mask[g * N].bool()].tolist() for g in range(WANT)]
    assert prompts == [TOK.encode("Q: 2*3?"), TOK.encode("Q: 3*4?")]
    assert float(exp.scores.mean()) == 1.0  # the tool turns answered right
    assert source.pool.trajectories == []  # the two quick groups ran to their end and were discarded


def test_reward_model_scores_rows_that_do_not_split_over_its_ranks():
    """The source scores the groups it offers: 3 rows on a reward model of 2 data-parallel ranks are padded to 4
    with a repeat, and the repeat's score dropped."""
    import torch

    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.protocol import ForwardAnswer, RolloutOutput, build_experience
    from mindspeed_rl.trainer.ppo.scoring import Scorer

    class RewardModel:
        dp_size = 2

        def forward(self, method, exp, balance=False):
            assert exp.num_rows % self.dp_size == 0
            self.rows = exp.num_rows
            return ForwardAnswer(exp.response_mask.sum(1).float())

    outputs = [RolloutOutput(0, [5] * k, [-0.1] * k, "stop") for k in (1, 2, 3)]
    exp = build_experience([[1, 2]], outputs, 3, 0)
    rm = RewardModel()
    cfg = load_ppo_config("ppo_tiny_cpu")
    assert Scorer(cfg, None, rm, TOK).reward_model_scores(exp).tolist() == [1.0, 2.0, 3.0] and rm.rows == 4
    assert torch.equal(exp.response_mask.sum(1), torch.tensor([1, 2, 3]))


def test_a_batch_is_the_rows_its_groups_were_scored_on_built_once(monkeypatch):
    """The rows made for scoring are the batch (no second build from the trajectories, no scores through floats);
    a group restored from a checkpoint is rebuilt to the same rows."""
    import torch

    import mindspeed_rl.rollout.source.rollout_source as source_module
    from mindspeed_rl.protocol import build_experience
    from mindspeed_rl.rollout.source.trajectory import group_outputs

    built = []

    def counted(*args, **kwargs):
        built.append(build_experience(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(source_module, "build_experience", counted)
    source = make_source("tool_agent")
    produced = source.produce(0)
    scored = len(built)
    batch = source.experience(produced)
    assert scored and len(built) == scored and batch.num_rows == WANT * N  # built for scoring only
    prompts, labels, outputs = group_outputs(produced.groups)
    fresh = build_experience(prompts, outputs, N, 0, labels, produced.version)
    for name in fresh.present():
        assert torch.equal(getattr(batch, name), getattr(fresh, name)), name
    assert batch.labels == fresh.labels and batch.scores is not None
    restored = [[Trajectory.from_state(json.loads(json.dumps(t.state()))) for t in g] for g in produced.groups]
    assert all(t.group_rows is None for g in restored for t in g)
    again = source.experience(Produced(0, produced.version, restored, {}, Clock(), 0.0))
    assert all(torch.equal(getattr(again, name), getattr(batch, name)) for name in batch.present())


def test_a_text_group_beside_image_groups_gets_no_image_inputs():
    """Rows carry their prompt's stored images (b"" for none); the worker decodes them into the model's inputs."""
    from types import SimpleNamespace

    import torch

    from mindspeed_rl.protocol import MODEL_INPUTS, Experience, RolloutOutput, build_experience
    from mindspeed_rl.workers.base_worker import model_inputs

    text = build_experience([[1, 2]], [RolloutOutput(0, [5], [-0.1], "stop")], 1, 0)
    outputs = [RolloutOutput(0, [6, 7], [-0.2, -0.3], "stop"), RolloutOutput(0, [8], [-0.4], "stop")]
    pictured = build_experience([[3]], outputs, 2, 0, images=[b"stored image"])
    assert pictured.images[0] is pictured.images[1]  # one bytes object per prompt: Ray sends it once
    both = Experience.cat([text, pictured], pad_id=0)
    assert both.images == [b"", b"stored image", b"stored image"] and both.select([2, 0]).images == [
        b"stored image",
        b"",
    ]
    decoded = {
        b"": (torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long)),
        b"stored image": (torch.ones(4, 6), torch.tensor([[1, 2, 2]])),
    }
    inputs = model_inputs(both, MODEL_INPUTS, SimpleNamespace(encode=decoded.__getitem__))
    pixels = inputs["pixel_values"]
    assert pixels.shape == (3, 4, 6) and not pixels[0].any() and pixels[1:].all()
    assert inputs["image_grid_thw"].tolist() == [[[0, 0, 0]], [[1, 2, 2]], [[1, 2, 2]]]
    assert "pixel_values" not in model_inputs(text, MODEL_INPUTS, SimpleNamespace(encode=decoded.__getitem__))
    blob = bytes(range(256)) * 400  # 100 KB of images: the 8 rows of its prompt pickle (as Ray sends them) it once
    eight = build_experience([[3]], [RolloutOutput(0, [6], [-0.2], "stop")] * 8, 8, 0, images=[blob])
    assert len(pickle.dumps(eight.select(fields=MODEL_INPUTS), protocol=5)) < 1.1 * len(blob)


def test_scoring_calls_average_means_and_add_up_counts():
    from mindspeed_rl.rollout.source.rollout_source import average

    merged = average(
        [(8, {"acc/mean": 0.5, "rule_reward/timeouts": 1.0}), (24, {"acc/mean": 0.1, "rule_reward/timeouts": 2.0})]
    )
    assert merged == {"acc/mean": pytest.approx(0.2), "rule_reward/timeouts": 3.0}


def test_images_ride_with_their_prompts_through_every_layer_and_a_resume():
    """Each prompt's images reach every request that continues it (partial chunks, tool turns, a batch produced
    ahead, a JSON round trip of the state) and the batch's rows carry their own prompt's, decoded as the workers
    decode them."""
    import io

    from PIL import Image

    from mindspeed_rl.datasets.images import pack_images

    def picture(text: str) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", (28, 28), (len(text) * 9 % 256, sum(map(ord, text)) % 256, 40)).save(out, format="PNG")
        return pack_images([out.getvalue()])

    class ImageDraws(Draws):
        def __call__(self):
            batch = super().__call__()
            batch.images = [picture(TOK.decode(p)) for p in batch.input_ids]
            return batch

    def source(service, draws):
        made = make_source("tool_agent", True, 4, 1, service=service, draws=draws)
        made.vision = True
        return made

    straight_service = ScriptedService()
    straight = [fingerprint_with_pixels(b) for b, _ in run(source(straight_service, ImageDraws()), 4)]
    for request in straight_service.requests:  # every row's images are its prompt's, wherever the row stands
        assert request.images is not None and len(request.images) == len(request.prompts)
        for prompt, blob in zip(request.prompts, request.images):
            question = TOK.decode(prompt).split("?")[0] + "?"
            assert blob == picture(TOK.decode(TOK.encode(question))), question
    draws, service = ImageDraws(), ScriptedService()
    first = source(service, draws)
    head = [fingerprint_with_pixels(b) for b, _ in run(first, 2)]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["pool"]["trajectories"] and all(t["images"] for t in state["pool"]["trajectories"])
    resumed_draws, resumed_service = ImageDraws(), ScriptedService()
    resumed_draws.consumed = draws.consumed
    resumed_service.update_weights(2)
    second = source(resumed_service, resumed_draws)
    second.load_state_dict({"rollout_source": state})
    assert head + [fingerprint_with_pixels(b) for b, _ in run(second, 2, start=2)] == straight


@functools.lru_cache(maxsize=None)
def image_encoder():
    from mindspeed_rl.datasets.images import ImageEncoder

    return ImageEncoder()


def fingerprint_with_pixels(batch):
    from mindspeed_rl.protocol import MODEL_INPUTS
    from mindspeed_rl.workers.base_worker import model_inputs

    exp = batch.experience
    inputs = model_inputs(exp, MODEL_INPUTS, image_encoder())
    assert len(exp.images) == exp.num_rows == inputs["pixel_values"].shape[0]
    assert inputs["image_grid_thw"].tolist() == [[[1, 2, 2]]] * exp.num_rows
    return fingerprint(batch) + (inputs["pixel_values"].tolist(),)


def test_each_schedule_speaks_its_protocol_and_is_chosen_from_its_keys():
    from types import SimpleNamespace

    from mindspeed_rl.rollout.source.schedules import (
        BatchSchedule,
        InStep,
        RoundSchedule,
        batch_schedule,
        round_schedule,
    )

    assert all(isinstance(s, RoundSchedule) for s in (Synchronous(8), Chunked(8, 2)))
    assert all(isinstance(s, BatchSchedule) for s in (InStep(), Ahead(1)))
    assert not isinstance(InStep(), RoundSchedule) and not isinstance(Synchronous(8), BatchSchedule)
    chunked = round_schedule(SimpleNamespace(partial_rollout_max_split=3, require_max_age_all_finished=False), 10)
    assert isinstance(chunked, Chunked) and chunked.chunk == 4 and not chunked.require_oldest
    assert isinstance(round_schedule(SimpleNamespace(partial_rollout_max_split=1), 10), Synchronous)
    assert isinstance(batch_schedule(0), InStep) and batch_schedule(2).lag == 2
    assert Synchronous(8).metrics(None, [], 1, 8, 2) == {}
