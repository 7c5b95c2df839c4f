"""rl_config.blocking false: the critic's calls beside the actor's worker's. The spans each call gets, the ``ways``
every call is told (and the CPU's share of threads for it), the trainer's choice of calls in turn or side by side,
and the plan line. The end-to-end run: tests/test_resume.py (its runs go side by side and resume exactly)."""

import contextlib
import time
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.accelerator.cpu import CpuAccelerator
from mindspeed_rl.features import load_ppo_config, plan_lines
from mindspeed_rl.protocol import ForwardAnswer, RankLayout, RolloutOutput, build_experience
from mindspeed_rl.trainer.ppo import model_steps
from mindspeed_rl.trainer.ppo.model_steps import ModelSteps, wait_side_by_side
from mindspeed_rl.utils.clock import Clock
from mindspeed_rl.workers.base_worker import shares_cores
from mindspeed_rl.workers.worker_group import WorkerGroup


class Finishing:
    """An object reference stand-in that is ready at ``at`` seconds."""

    def __init__(self, at: float):
        self.at = at


@pytest.fixture
def timed_ray(monkeypatch):
    """ray.wait answers with the reference ready first, time.time() moved on to its moment (from 100 s)."""
    import ray

    now = [100.0]

    def wait(refs, num_returns=1):
        first = min(refs, key=lambda ref: ref.at)
        now[0] = 100.0 + first.at
        return [first], [ref for ref in refs if ref is not first]

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(model_steps.time, "time", lambda: now[0])


def test_each_call_spans_from_the_end_of_the_one_before_it_in_its_lane_to_its_last_rank(timed_ray):
    clock = Clock()
    actor = [("timing/reference_model", [Finishing(2.0), Finishing(1.5)]), ("timing/old_log_p", [Finishing(3.0)])]
    critic = [("timing/critic_model", [Finishing(2.5), Finishing(1.0)])]
    wait_side_by_side(clock, [actor, critic])
    spans = {name: (start - 100.0, end - 100.0) for name, start, end in clock.spans}
    assert spans == {
        "timing/reference_model": (0.0, 2.0),
        "timing/old_log_p": (2.0, 3.0),
        "timing/critic_model": (0.0, 2.5),
    }
    assert clock.timing == {"timing/reference_model": 2.0, "timing/old_log_p": 1.0, "timing/critic_model": 2.5}


def test_the_cpu_gives_a_call_beside_another_its_share_of_the_threads_and_takes_it_back():
    acc, before = CpuAccelerator(), torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with acc.sharing_cores(2):
            assert torch.get_num_threads() == 1
        with pytest.raises(RuntimeError), acc.sharing_cores(2):
            raise RuntimeError("a failing call")
        assert torch.get_num_threads() == 2
        with acc.sharing_cores(1):
            assert torch.get_num_threads() == 2
        with acc.sharing_cores(4):  # never below one
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


class Worker:
    """A worker method as the Ray actor runs it: ``ways`` reaches the accelerator, not the method."""

    def __init__(self):
        self.acc, self.ways, self.calls = self, [], []

    def sharing_cores(self, ways):
        self.ways.append(ways)
        return contextlib.nullcontext()

    @shares_cores
    def compute(self, rows, tag="x"):
        self.calls.append((rows, tag))
        return rows


def test_a_worker_method_takes_ways_for_its_accelerator_and_runs_as_before():
    worker = Worker()
    assert worker.compute(3, tag="y", ways=2) == 3 and worker.compute(4) == 4
    assert worker.ways == [2, 1] and worker.calls == [(3, "y"), (4, "x")]


def test_ray_takes_ways_in_the_calls_of_the_real_workers():
    """Ray checks a call's arguments against the method it unwraps (inspect.unwrap), before the call leaves."""
    import inspect

    from ray._common.signature import extract_signature, validate_args

    from mindspeed_rl.workers.actor_worker import IntegratedActorWorker
    from mindspeed_rl.workers.critic_worker import CriticWorker

    for method, args in (
        (CriticWorker.compute_values, ("rows",)),
        (CriticWorker.update, ([],)),
        (IntegratedActorWorker.compute_log_prob, ("rows", "ref")),
        (IntegratedActorWorker.update, ([], 0.1)),
    ):
        parameters = extract_signature(inspect.unwrap(method), ignore_first=True)
        validate_args(parameters, args, {"ways": 2})
        with pytest.raises(TypeError):
            validate_args(parameters, args, {"threads": 2})


class Remote:
    """A Ray actor handle stand-in: ``handle.method.remote(...)`` records the call and answers at once."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def __getattr__(self, name):
        def remote(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self.answer(name, *args)

        return type("Method", (), {"remote": staticmethod(remote)})


def fake_group(name):
    def answer(method, rows, *extra):
        if method == "update":
            return {f"{name}/loss": 1.0}
        fill = {"compute_values": 0.5, "compute_log_prob": -1.0 if extra == ("ref",) else -2.0}[method]
        return ForwardAnswer(torch.full((rows.num_rows, rows.response_width), fill), {})

    handle = Remote(answer)
    layout = RankLayout(rank=0, dp_rank=0, dp_size=1, tp_rank=0, pp_rank=0, output=True)
    return WorkerGroup(name, [handle], [layout]), handle


class Trainer(ModelSteps):
    def __init__(self, blocking, use_critic=True, skip_old=False):
        self.actor, self.actor_handle = fake_group("actor")
        self.critic, self.critic_handle = fake_group("critic")
        self.rl = SimpleNamespace(
            blocking=blocking, use_dp_batch_balance=False, mini_batch_size=4, epochs=1, shuffle_mini_batch=False
        )
        self.gen = SimpleNamespace(sampling_config=SimpleNamespace(max_tokens=2))
        self.cfg = SimpleNamespace(megatron_training=SimpleNamespace(seed=1))
        self.kl_ctrl = SimpleNamespace(value=0.1)
        self.use_critic, self.use_ref, self.skip_old_log_prob = use_critic, True, skip_old
        self.iteration, self.clock, self.forward_metrics = 0, Clock(), {}

    def timer(self, name):
        return self.clock.measure(name)


def experience():
    prompts = [[1, 2], [3]]
    outputs = [RolloutOutput(p, [5, 6], [-0.5, -0.5], "stop") for p in range(2) for _ in range(2)]
    exp = build_experience(prompts, outputs, 2, pad_id=0)
    for field in ("advantages", "returns"):
        exp.set(field, torch.zeros(4, 2))
    return exp


@pytest.mark.parametrize("blocking", [True, False])
def test_the_trainer_runs_the_critic_beside_the_actor_only_when_not_blocking(blocking, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(ray, "put", lambda value: value)
    waited = []

    def wait(clock, lanes):
        waited.append([[name for name, _ in lane] for lane in lanes])
        for lane in lanes:
            for name, _ in lane:
                clock.add(name, 0.0)

    monkeypatch.setattr(model_steps, "wait_side_by_side", wait)
    trainer, exp = Trainer(blocking), experience()
    trainer.forwards(exp)
    assert exp.ref_log_probs.eq(-1.0).all() and exp.old_log_probs.eq(-2.0).all() and exp.values.eq(0.5).all()
    metrics = trainer.updates(exp)
    assert metrics == {"actor/loss": 1.0, "critic/loss": 1.0}
    ways = 1 if blocking else 2
    calls = trainer.actor_handle.calls + trainer.critic_handle.calls
    assert [c[0] for c in calls] == ["compute_log_prob", "compute_log_prob", "update", "compute_values", "update"]
    assert all(kwargs.get("ways", 1) == ways for _, _, kwargs in calls), calls
    beside = [[["timing/reference_model", "timing/old_log_p"], ["timing/critic_model"]]]
    assert waited == ([] if blocking else beside + [[["timing/update"], ["timing/update_critic"]]])
    assert set(trainer.clock.timing) == {
        "timing/reference_model",
        "timing/old_log_p",
        "timing/critic_model",
        "timing/update",
        "timing/update_critic",
    }


def test_without_a_critic_nothing_runs_beside_and_the_calls_take_every_core(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(ray, "put", lambda value: value)
    trainer, exp = Trainer(False, use_critic=False, skip_old=True), experience()
    trainer.forwards(exp)
    trainer.updates(exp)
    assert [c[0] for c in trainer.actor_handle.calls] == ["compute_log_prob", "update"]
    assert all(kwargs.get("ways", 1) == 1 for _, _, kwargs in trainer.actor_handle.calls)
    assert not trainer.critic_handle.calls and exp.values is None


def test_blocking_false_is_taken_and_the_plan_says_what_runs_beside_what():
    beside = plan_lines(load_ppo_config("ppo_tiny_cpu", ["rl_config.blocking=false"]))
    assert any("the critic's beside the actor's worker's" in line for line in beside), beside
    in_turn = plan_lines(load_ppo_config("ppo_tiny_cpu", ["rl_config.blocking=true"]))
    assert not any("stages    :" in line for line in in_turn)
    grpo = plan_lines(load_ppo_config("grpo_tiny_cpu", ["rl_config.blocking=false"]))
    assert any("no critic" in line for line in grpo), grpo


def test_a_call_span_is_recorded_in_wall_clock_seconds():
    clock, start = Clock(), time.time()
    clock.record("timing/x", start, start + 1.5)
    assert clock.timing == {"timing/x": 1.5} and clock.spans == [("timing/x", start, start + 1.5)]
