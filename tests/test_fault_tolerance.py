"""Rollout engines that fail without failing the run (rl_config.rollout_fault_tolerance): garbage answers told apart,
a fleet of stepping engines (threaded Ray actors) whose processes are killed, stopped or answer garbage mid-generation
or mid-sync, the deadlines without fault tolerance, the refusals, the colocated engine's message and its way to the
run's restart, and real runs of the asynchronous twins on two rollout engines with faults injected
(MINDSPEED_RL_INJECT_FAULTS): against the same run without them, with in-flight updates, below min_healthy_engines."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mindspeed_rl.config_cls import SamplingConfig
from mindspeed_rl.protocol import RolloutOutput, RolloutRequest
from mindspeed_rl.workers.engine_health import FaultLimits, answer_problem
from mindspeed_rl.workers.fault_injection import parse_faults
from tests.helpers import ROOT
from tests.test_faults import RUN_MARK, orphaned_after, train_ppo, user_error

LIMITS = FaultLimits(
    enabled=True, generate_timeout_s=30, weight_sync_timeout_s=5, health_check_interval_s=0.2,
    health_check_timeout_s=1.0, max_restarts_per_engine=1,
)  # fmt: skip


# ----- what counts as garbage -------------------------------------------------------------------------------------
def _answer(ids, logprobs=None, index=0):
    return RolloutOutput(index, ids, logprobs if logprobs is not None else [-0.5] * len(ids), "length")


@pytest.mark.parametrize(
    "outputs,words",
    [
        ([_answer([1, 2]), _answer([3, 4], index=1)], None),
        ([_answer([1, 2])], "1 answers for 2 prompt(s)"),
        ([_answer([1, 2]), _answer([1000, 4], index=1)], "outside the vocabulary of 1000"),
        ([_answer([1, 2]), _answer([3, 4], [-0.1, float("nan")], index=1)], "log-probs"),
        ([_answer([1, 2]), _answer([3, 4], [-0.1], index=1)], "log-probs"),
        ([_answer([1, 2]), _answer([3, 4], [0.7, -1.0], index=1)], "log-probs"),
        ([_answer([1, 2]), _answer([3] * 9, index=1)], "9 tokens past the budget of 8"),
    ],
)
def test_an_answer_is_garbage_when_it_breaks_what_any_engine_guarantees(outputs, words):
    request = RolloutRequest([[5], [6]], 1, 0, SamplingConfig(max_tokens=8))
    problem = answer_problem(outputs, request, vocab_size=1000, max_tokens=64)
    assert problem is None if words is None else words in problem, problem


def test_the_injected_faults_parse_or_are_refused_naming_the_variable():
    faults = parse_faults("kill@generate:1:2, stop@weights:0:3,garbage@generate:0:1")
    assert [(f.action, f.phase, f.engine, f.call) for f in faults] == [
        ("kill", "generate", 1, 2), ("stop", "weights", 0, 3), ("garbage", "generate", 0, 1)
    ]  # fmt: skip
    for bad in ("kill@generate:1", "boom@generate:0:1", "kill@load:0:1", "kill@generate:0:0", "garbage@weights:0:1"):
        with pytest.raises(ValueError, match="MINDSPEED_RL_INJECT_FAULTS"):
            parse_faults(bad)


# ----- a fleet of stepping engines -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster(without_shared_ray):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    yield
    ray.shutdown()


def _fleet(limits=LIMITS, step_s=0.03, restarts=True):
    from tests.rollout_fakes import stepping_fleet

    actor, fleet = stepping_fleet(limits, step_s=step_s, restarts=restarts)
    fleet.sync_weights(actor, 0)
    return actor, fleet


def _pid(fleet, engine):
    import ray

    return ray.get(fleet.engines[engine].group.call_async("health"))[0]["pid"]


def _gone(pid, within=10.0):
    until = time.monotonic() + within
    while time.monotonic() < until:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


REQUEST = RolloutRequest([[1], [2], [3], [4]], 2, 100, SamplingConfig(max_tokens=40))


def _generate_with(fleet, engine, sig, after_s=0.3):
    """The fleet's answer to REQUEST while engine ``engine``'s process gets ``sig`` ``after_s`` into it."""
    pid = _pid(fleet, engine)
    pending = fleet.submit_generate(REQUEST)
    time.sleep(after_s)
    os.kill(pid, sig)
    started = time.monotonic()
    batch = fleet.collect_generate(pending)
    return batch, pid, time.monotonic() - started


def _accounted(batch):
    """Every prompt's two samples, once each, in the order of the request (whichever engine finished first)."""
    assert [out.prompt_index for out in batch.outputs] == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_a_killed_or_stopped_engine_leaves_service_its_part_moves_and_it_restarts_with_the_weights(ray_cluster, sig):
    import ray

    actor, fleet = _fleet()
    batch, pid, waited = _generate_with(fleet, 1, sig)
    _accounted(batch)
    assert {r.engine for r in batch.per_rank} == {0}  # engine 1's prompts were generated by engine 0
    # SIGSTOP: told by the health probe (answer within 1 s, every 0.2 s), the moved part then runs for ~2 s
    assert waited < 8.0, waited
    assert _gone(pid), "the failed engine's process is left behind"
    assert [e.serving for e in fleet.engines] == [True, False]
    fleet.sync_weights(actor, 1)  # engine 1 restarts and gets version 1 before it serves
    assert [e.serving for e in fleet.engines] == [True, True]
    assert [h["version"] for h in ray.get(fleet.call_async("health"))] == [1, 1]
    metrics = fleet.metrics()
    assert metrics["fleet/engine_failures"] == 1 and metrics["fleet/engine_restarts"] == 1
    assert metrics["fleet/requests_moved"] == 4 and metrics["fleet/time_lost_s"] > 0
    _accounted(fleet.collect_generate(fleet.submit_generate(REQUEST)))
    assert fleet.metrics()["fleet/engine_failures"] == 0  # counts since the last call


def test_an_engine_answering_garbage_is_replaced_like_a_dead_one(ray_cluster):
    import ray

    actor, fleet = _fleet(step_s=0.001)
    pid = _pid(fleet, 0)
    ray.get(fleet.engines[0].group.call_async("answer_garbage"))
    batch = fleet.collect_generate(fleet.submit_generate(REQUEST))
    _accounted(batch)
    assert all(max(out.response_ids) < 1000 for out in batch.outputs)
    assert _gone(pid) and fleet.metrics()["fleet/requests_moved"] == 4


def test_an_engine_stopped_before_a_weight_sync_is_replaced_within_the_sync_deadline(ray_cluster):
    import ray

    actor, fleet = _fleet()
    pid = _pid(fleet, 1)
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    fleet.sync_weights(actor, 1)
    assert time.monotonic() - started < LIMITS.weight_sync_timeout_s + 10
    assert _gone(pid) and [e.serving for e in fleet.engines] == [True, True]
    assert [h["version"] for h in ray.get(fleet.call_async("health"))] == [1, 1]


def test_below_min_healthy_engines_the_fleet_says_why_and_with_none_left_it_stops(ray_cluster):
    from dataclasses import replace

    from mindspeed_rl.rollout.service import EngineFailed

    actor, fleet = _fleet(replace(LIMITS, min_healthy_engines=2), restarts=False)
    _accounted(_generate_with(fleet, 0, signal.SIGKILL)[0])
    assert "1 rollout engine(s) in service, below rl_config.rollout_fault_tolerance.min_healthy_engines = 2" in (
        fleet.stop_reason or ""
    )
    fleet.sync_weights(actor, 1)  # no restart: still below
    assert fleet.stop_reason is not None
    os.kill(_pid(fleet, 1), signal.SIGKILL)
    time.sleep(1.0)
    with pytest.raises(EngineFailed, match="no rollout engine in service"):
        fleet.collect_generate(fleet.submit_generate(REQUEST))


def test_without_fault_tolerance_a_hang_stops_the_run_naming_the_engine_the_phase_and_the_key(ray_cluster):
    from mindspeed_rl.rollout.service import EngineFailed

    limits = FaultLimits(generate_timeout_s=2.0)
    _, fleet = _fleet(limits)
    stopped = _pid(fleet, 1)
    started = time.monotonic()
    try:
        with pytest.raises(EngineFailed) as raised:
            _generate_with(fleet, 1, signal.SIGSTOP)
    finally:
        os.kill(stopped, signal.SIGKILL)
    assert time.monotonic() - started < 2.0 + 5.0  # within the deadline plus seconds
    assert (
        "rollout engine 1 failed during generate: no answer within 2 s "
        "(rl_config.rollout_fault_tolerance.generate_timeout_s)" in str(raised.value)
    )


def test_a_colocated_engine_that_dies_is_named_as_the_actors_engine(ray_cluster):
    import ray

    from mindspeed_rl.rollout.service import ColocatedRollout, EngineFailed
    from mindspeed_rl.workers.rollout_worker import RolloutWorker
    from mindspeed_rl.workers.worker_group import WorkerGroup
    from tests.rollout_fakes import stepping_worker_class

    worker = ray.remote(concurrency_groups=RolloutWorker.CONCURRENCY_GROUPS)(stepping_worker_class())
    handle = worker.remote(0, False, 0.05)
    group = WorkerGroup("actor", [handle])
    group.load_layouts()
    service = ColocatedRollout(group, generate_timeout_s=30)
    pid = ray.get(handle.health.remote())["pid"]
    handle_request = service.submit(REQUEST)
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineFailed, match=r"rollout engine\(s\) \[0\] in the actor's worker\(s\) of rank \[0\]"):
        service.collect(handle_request)


def test_a_failed_engine_ends_the_run_frame_as_a_dead_worker_so_the_run_restarts(ray_cluster, tmp_path):
    """ray_run turns EngineFailed into WorkerDied, which train_healing restarts (rl_config.max_restarts), naming the
    engine and the last checkpoint."""
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.rollout.service import EngineFailed
    from mindspeed_rl.trainer.runtime.failures import WorkerDied
    from mindspeed_rl.trainer.runtime.ray_run import ray_run

    cfg = load_ppo_config("grpo_tiny_cpu", [f"actor_config.save={tmp_path}/ckpt"])
    with pytest.raises(WorkerDied) as died:
        with ray_run(cfg, str(tmp_path), None, 1, "rl_config.actor_resource.num_npus 1"):
            raise EngineFailed("rollout engine(s) [0] in the actor's worker(s) of rank [0] (colocated) died")
    assert str(died.value).startswith("rollout engine(s) [0] in the actor's worker(s) of rank [0] (colocated) died.")
    assert "No checkpoint was saved yet" in str(died.value)


# ----- the keys -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,words",
    [
        (["rl_config.rollout_fault_tolerance.enabled=true"], "takes rollout workers of their own"),
        (
            ["rl_config.rollout_resource.num_npus=1", "rl_config.rollout_fault_tolerance.enabled=true",
             "rl_config.rollout_fault_tolerance.min_healthy_engines=2"],
            "2 is above the run's 1 rollout engine(s)",
        ),
        (
            ["rl_config.rollout_resource.num_npus=1", "rl_config.rollout_fault_tolerance.enabled=true",
             "rl_config.rollout_fault_tolerance.health_check_timeout_s=5000"],
            "is not below generate_timeout_s",
        ),
        (["rl_config.rollout_fault_tolerance.weight_sync_timeout_s=0"], "weight_sync_timeout_s"),
    ],
)  # fmt: skip
def test_fault_tolerance_keys_that_do_not_fit_are_refused(capsys, overrides, words):
    err = user_error(capsys, train_ppo.main, ["--config-name", "grpo_tiny_cpu", "dry_run=true", *overrides])
    assert words in err and "rl_config.rollout_fault_tolerance" in err, err


# ----- real runs: two rollout engines, faults injected ----------------------------------------------------------------
def _run(tmp_path, demo_assets, name, faults, *extra, config="grpo_tiny_cpu_async", iterations=2):
    args = [
        sys.executable, os.path.join(ROOT, "cli", "train_ppo.py"), "--config-name", config,
        f"megatron_training.tokenizer_name_or_path={demo_assets['tokenizer']}",
        f"megatron_training.data_path={demo_assets['data_prefix']}",
        "megatron_training.test_data_path=null", "rl_config.test_freq=0", "rl_config.val_before_train=false",
        f"megatron_training.train_iters={iterations}", f"rl_config.log_dir={tmp_path}/{name}", "actor_config.save=null",
        "rl_config.rollout_resource.num_npus=2", "rl_config.rollout_fault_tolerance.enabled=true",
        "rl_config.rollout_fault_tolerance.health_check_interval_s=1",
        "rl_config.rollout_fault_tolerance.health_check_timeout_s=5",
        "rl_config.rollout_fault_tolerance.weight_sync_timeout_s=20", *extra,
    ]  # fmt: skip
    env = dict(os.environ, MINDSPEED_RL_INJECT_FAULTS=faults, **{RUN_MARK: str(tmp_path)})
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = [os.path.join(tmp_path, name, d) for d in os.listdir(tmp_path / name)]
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert len(rows) == iterations
    with open(os.path.join(run_dir, "report.html"), encoding="utf-8") as fh:
        report = fh.read()
    return out.stdout, rows, report


@pytest.mark.slow
def test_engines_killed_mid_generation_and_mid_sync_leave_the_run_as_it_would_have_been(tmp_path, demo_assets):
    """Engine 1 killed 0.2 s into its first generate call, engine 0 killed after the first piece of its second weight
    sync (after iteration 1): both restart, every sample is generated, and each iteration equals the run without
    faults (vLLM samples each request with its own seed, on whichever engine)."""
    _, clean, _ = _run(tmp_path, demo_assets, "clean", "")
    out, faulty, report = _run(tmp_path, demo_assets, "faulty", "kill@generate:1:1,kill@weights:0:2")
    assert "rollout engine 1 failed during generate: its process died" in out
    assert "rollout engine 0 failed during a weight sync" in out and out.count("restarted (1 of 3)") == 2
    assert sum(r["fleet/engine_restarts"] for r in faulty) == 2 and faulty[0]["fleet/requests_moved"] == 64
    assert "rollout engine faults (run total)" in report and "2 engine_restarts, 64 requests_moved" in report
    for key in ("critic/score/mean", "response_length/mean", "actor/kl_loss", "actor/pg_loss", "grad_norm"):
        assert [r[key] for r in faulty] == pytest.approx([r[key] for r in clean], abs=1e-6), key
    assert orphaned_after(tmp_path, set(), seconds=15.0) == set()  # no Ray process of its runs left


@pytest.mark.slow
def test_an_engine_stopped_with_in_flight_updates_on_is_replaced_and_the_run_finishes(tmp_path, demo_assets):
    """The fully asynchronous twin: engine 0 stops (SIGSTOP) in its second generate call, its health probe tells
    within 5 s, its requests finish on engine 1, and it restarts at the next in-flight update."""
    out, rows, _ = _run(
        tmp_path, demo_assets, "in_flight", "stop@generate:0:2", "rl_config.async_training.pause_timeout_s=10",
        config="grpo_tiny_cpu_fully_async", iterations=3,
    )  # fmt: skip
    assert "rollout engine 0 failed during generate: its health probe had no answer within 5 s" in out
    assert sum(r["fleet/engine_failures"] for r in rows) == 1 and sum(r["fleet/engine_restarts"] for r in rows) == 1
    assert rows[-1]["fleet/engines_in_service"] == 2  # restarted at the update after the failure
    assert all(r["response_length/mean"] > 0 for r in rows) and rows[-1]["iteration"] == 3
    assert orphaned_after(tmp_path, set(), seconds=15.0) == set()  # no Ray process of its runs left


def test_below_min_healthy_engines_the_run_saves_its_iteration_and_exits_4(tmp_path, monkeypatch, capsys):
    """fit()'s bookkeeping with a fleet that falls below min_healthy_engines during iteration 2 (save_interval 50):
    iteration 2 is saved all the same, and the run stops with exit 4, the key, the iteration and the checkpoint."""
    from types import SimpleNamespace

    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer import launch
    from mindspeed_rl.trainer.ppo.ppo_trainer import PPOTrainer
    from mindspeed_rl.trainer.runtime.failures import EXIT_WORKER_DIED

    cfg = load_ppo_config(
        "grpo_tiny_cpu_async",
        ["rl_config.rollout_resource.num_npus=2", "rl_config.rollout_fault_tolerance.enabled=true",
         "rl_config.rollout_fault_tolerance.min_healthy_engines=2", f"actor_config.save={tmp_path}/actor",
         f"rl_config.log_dir={tmp_path}/logs", "megatron_training.train_iters=3"],
    )  # fmt: skip
    saved = []
    service = SimpleNamespace(stop_reason=None)
    trainer = SimpleNamespace(rl=cfg.rl, cfg=cfg, iteration=0, collapse_streak=0, rollout_service=service)
    trainer.save = lambda: saved.append(trainer.iteration)
    healthy = {"actor/entropy": 0.8, "grad_norm": 0.4}

    def train(_):
        for _ in range(3):
            trainer.iteration += 1
            if trainer.iteration == 2:
                service.stop_reason = (
                    "1 rollout engine(s) in service, below rl_config.rollout_fault_tolerance.min_healthy_engines = 2"
                )
            PPOTrainer.after_iteration(trainer, healthy)
        return [healthy]

    monkeypatch.setattr(launch, "train", train)
    assert launch.run(cfg) == EXIT_WORKER_DIED and saved == [2]
    err = capsys.readouterr().err
    stopped = "stopped: 1 rollout engine(s) in service, below rl_config.rollout_fault_tolerance.min_healthy_engines = 2"
    assert f"{stopped}; iteration 2 finished" in err and "Traceback" not in err, err


def test_a_dead_rollout_worker_is_named_by_its_engine():
    """Without fault tolerance a dead engine is a dead worker: named by its engine (the groups are rollout<engine>)."""
    from mindspeed_rl.trainer.runtime.failures import worker_name

    died = RuntimeError("The actor died: ray::rollout1_0_123450002:RolloutWorker.generate() ...")
    assert worker_name(died, []) == "the rollout worker of engine 1 (its rank 0)"
    assert worker_name(RuntimeError("ray::critic_3_123450001 died"), []) == "the critic worker of rank 3"
