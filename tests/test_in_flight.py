"""Fully asynchronous rollout: the pause gate, per-token versions, the staleness bound, the InFlight schedule on a
scripted service whose answers cross weight updates, the refusals of rl_config.async_training, and vLLM driven
step by step with a weight update between two steps (kept KV cache, or recomputed by preemption or by
resubmission)."""

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mindspeed_rl.rollout.engines.in_flight import PauseGate
from mindspeed_rl.rollout.source.agent_loop import AgentContext, SingleTurn, ToolAgent
from mindspeed_rl.rollout.source.group_filter import DynamicSampling, KeepAll
from mindspeed_rl.rollout.source.rollout_source import RolloutSource
from mindspeed_rl.rollout.source.schedules import BatchSchedule, Chunked, InFlight, Synchronous, batch_schedule
from mindspeed_rl.rollout.source.staleness import StalenessBound
from mindspeed_rl.rollout.source.trajectory import FINISHED, Trajectory
from tests.helpers import ROOT
from tests.rollout_fakes import TOK, Draws, ScriptedService, score, tool_context
from tests.test_faults import train_ppo, user_error

N, WANT, MAX_TOKENS = 4, 2, 320


# ----- the gate ----------------------------------------------------------------------------------------------
def test_a_pause_returns_once_the_step_in_progress_ends_and_no_step_runs_until_the_resume():
    gate, events = PauseGate(), []

    def generating():
        with gate.generating():
            for k in range(3):
                recompute = gate.hold_point()
                events.append(("step", k, recompute))
                time.sleep(0.2)

    thread = threading.Thread(target=generating)
    thread.start()
    time.sleep(0.05)  # step 0 runs
    t0 = time.perf_counter()
    assert gate.pause(5.0)
    waited = time.perf_counter() - t0
    events.append(("paused",))
    time.sleep(0.3)
    assert events[-1] == ("paused",) and gate.paused  # no step ran while paused
    gate.resume(recompute=True)
    thread.join()
    assert 0.05 < waited < 1.0  # the events below show it did not wait for the later steps
    assert events == [("step", 0, False), ("paused",), ("step", 1, True), ("step", 2, False)]
    assert gate.pause(0.01)  # nothing generates: at once
    gate.resume()


def in_a_long_step(gate: PauseGate, seconds: float) -> threading.Thread:
    """A generation whose one step takes ``seconds`` (a hung engine), started and inside its step on return."""
    started = threading.Event()

    def hung_step():
        with gate.generating():
            gate.hold_point()
            started.set()
            time.sleep(seconds)

    thread = threading.Thread(target=hung_step)
    thread.start()
    started.wait()
    return thread


def test_a_pause_past_its_deadline_reports_it_and_opens_the_gate_again():
    gate = PauseGate()
    thread = in_a_long_step(gate, 1.0)
    assert not gate.pause(0.2)
    assert not gate.paused
    thread.join()


def test_the_ranks_of_one_engine_hold_at_the_same_step_whichever_rank_is_paused_first():
    """Two ranks of one engine (infer TP 2) step in lockstep (a barrier per step stands for the engine's collectives);
    before each step the first rank's "my gate is closed" goes to both (``agree``). Paused at once, one rank a few
    milliseconds after the other (either first), they always hold before the same step, and no step runs between
    both pauses and the resumes."""
    import random

    rng = random.Random(3)
    gates, steps = [PauseGate(), PauseGate()], [[], []]
    step_barrier, agree_barrier = threading.Barrier(2), threading.Barrier(2)
    leader_says = [False]
    loaded = [0]

    def agree_of(rank):
        def agree(closed):
            if rank == 0:
                leader_says[0] = closed
            agree_barrier.wait()  # the broadcast: both read the first rank's decision
            decision = leader_says[0]
            agree_barrier.wait()
            return decision

        return agree

    def rank_loop(rank):
        with gates[rank].generating():
            for k in range(100):
                gates[rank].hold_point(agree_of(rank))
                step_barrier.wait()  # the engine's collective: both ranks in the same step
                steps[rank].append((k, loaded[0]))
                time.sleep(0.003)

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for update in range(4):
        time.sleep(rng.uniform(0.01, 0.04))
        # as the service does: both pauses at once (each rank's call on a thread of its own), one a little later
        delays = [rng.uniform(0.0, 0.01), rng.uniform(0.0, 0.01)]
        paused = [None, None]

        def pause(rank):
            time.sleep(delays[rank])
            paused[rank] = gates[rank].pause(5.0)

        pausing = [threading.Thread(target=pause, args=(r,)) for r in range(2)]
        for t in pausing:
            t.start()
        for t in pausing:
            t.join()
        assert paused == [True, True]
        loaded[0] = update + 1  # "the weights": no step may run while they change
        time.sleep(0.01)
        for gate in gates:
            gate.resume()
    for t in threads:
        t.join(10)
    assert steps[0] == steps[1] and len(steps[0]) == 100  # the same steps, each with the same weights
    versions = [v for _, v in steps[0]]
    assert versions == sorted(versions) and versions[-1] == 4


def test_the_worker_names_the_engine_and_the_key_when_its_engine_does_not_pause():
    from types import SimpleNamespace

    from mindspeed_rl.workers.rollout_worker import PauseTimeout, RolloutWorker

    gate = PauseGate()
    worker = SimpleNamespace(gate=gate, engine_index=1, rank=1)
    thread = in_a_long_step(gate, 0.8)
    with pytest.raises(PauseTimeout, match=r"rollout engine 1 \(rank 1\).*rl_config.async_training.pause_timeout_s"):
        RolloutWorker.pause_generation(worker, 0.1)
    thread.join()


# ----- versions and the staleness bound ---------------------------------------------------------------------
def test_a_trajectory_records_each_tokens_version_and_its_oldest_generated_one():
    traj = Trajectory(0, [1], "", 10)
    traj.append([5, 6, 7], [-0.1, -0.2, -0.3], [2, 2, 3], trained=True)
    traj.append([9], [], 3, trained=False)  # a tool result: not generated, not counted as oldest
    assert traj.versions == [2, 2, 3, 3] and traj.oldest_version() == 2
    with pytest.raises(ValueError, match="trajectory 0: 2 versions for 3 tokens"):
        traj.append([1, 2, 3], [0.0] * 3, [1, 1], trained=True)
    traj.restart()
    assert traj.tokens == [] and traj.versions == [] and traj.oldest_version() is None and not traj.done


def _group(oldest):
    out = []
    for uid, version in enumerate(oldest):
        traj = Trajectory(uid, [1], "", 8)
        traj.append([3, 4], [-0.5, -0.5], [version, version + 1], trained=True)
        traj.end(FINISHED, "stop")
        out.append(traj)
    return out


@pytest.mark.parametrize("policy", ["drop", "regenerate"])
def test_a_group_with_a_token_more_than_max_staleness_versions_old_is_never_offered(policy):
    bound = StalenessBound(2, policy)
    # trains at version 5: the oldest allowed token is version 3
    fresh_group, stale_group, edge_group = _group([4, 3]), _group([3, 2]), _group([3, 3])
    fresh, again = bound.screen([fresh_group, stale_group, edge_group], trains_at=5)
    assert [g[0].uid for g in fresh] == [0, 0] and len(fresh) == 2  # fresh_group and edge_group
    assert len(again) == (1 if policy == "regenerate" else 0)
    if policy == "regenerate":
        assert all(not t.done and not t.tokens for t in again[0])
    assert bound.metrics() == {
        "async/stale_groups_dropped": float(policy == "drop"),
        "async/stale_groups_regenerated": float(policy == "regenerate"),
    }
    assert bound.metrics()["async/stale_groups_dropped"] == 0.0  # counted once
    assert StalenessBound().screen([stale_group], 100) == ([stale_group], []) and StalenessBound().metrics() == {}


# ----- the InFlight schedule on a scripted service -------------------------------------------------------------
class InFlightService(ScriptedService):
    """The scripted task as if every request had started before the latest in-flight update: each answer's earlier
    half carries the version before the service's, the rest the service's."""

    def submit(self, request):
        handle = super().submit(request)
        for out in handle.pending:
            half = len(out.response_ids) // 2
            out.versions = [max(0, self.version - 1)] * half + [self.version] * (len(out.response_ids) - half)
        return handle


def in_flight_source(function="single_turn", ds=False, split=1, lag=2, max_staleness=None, policy="drop", draws=None):
    fn = ToolAgent(tool_context()) if function == "tool_agent" else SingleTurn(AgentContext(None, TOK))
    flt = DynamicSampling(WANT, "acc", 4) if ds else KeepAll(WANT)
    schedule = Chunked(MAX_TOKENS, split) if split > 1 else Synchronous(MAX_TOKENS)
    return RolloutSource(
        InFlightService(), fn, flt, schedule, draws or Draws(), score, N, MAX_TOKENS, 7, 0, batch_schedule(lag, True),
        staleness=StalenessBound(max_staleness, policy),
    )  # fmt: skip


def run(source, iterations, start=0):
    out = []
    for it in range(start, start + iterations):
        batch = source.next_batch(it)
        source.settle()  # InFlight: nothing to wait for
        source.service.update_weights(it + 1)
        out.append((batch, it))
    return out


def uids(batch):
    return sorted({int(u) for u in batch.experience.group.tolist()})


@pytest.mark.parametrize(
    "function,ds,split", [(f, d, s) for f in ("single_turn", "tool_agent") for d in (0, 1) for s in (1, 4)]
)
def test_every_combination_runs_fully_async_with_the_staleness_bound(function, ds, split):
    source = in_flight_source(function, bool(ds), split, lag=2, max_staleness=2)
    assert isinstance(source.ahead, InFlight) and isinstance(source.ahead, BatchSchedule)
    assert source.ahead.settle() == 0.0
    mixed = 0
    for batch, it in run(source, 5):
        exp = batch.experience
        assert exp.num_rows == WANT * N
        generated = exp.loss_mask.bool()
        versions = exp.policy_version[generated]
        assert int(versions.max()) <= it and int(versions.min()) >= it - 2, (it, versions.unique().tolist())
        mixed += sum(len(set(v[m].tolist())) > 1 for v, m in zip(exp.policy_version, generated))
        assert {"async/stale_groups_dropped", "async/stale_groups_regenerated"} <= set(batch.metrics)
    source.close()
    assert mixed > 0  # answers that crossed an update


@pytest.mark.parametrize("policy", ["drop", "regenerate"])
def test_stale_parked_trajectories_are_dropped_or_regenerated_and_counted(policy):
    """Partial rollout parks trajectories for up to 3 iterations on top of a lag of 2; a bound of 1 makes some
    stale: they are counted and no trained token is more than 1 version old."""
    source = in_flight_source("tool_agent", split=4, lag=2, max_staleness=1, policy=policy)
    counted = 0
    for batch, it in run(source, 6):
        exp = batch.experience
        assert int(exp.policy_version[exp.loss_mask.bool()].min()) >= it - 1
        counted += batch.metrics[f"async/stale_groups_{'dropped' if policy == 'drop' else 'regenerated'}"]
    source.close()
    assert counted > 0


def test_a_checkpoint_of_the_fully_async_source_resumes_losing_and_repeating_no_trajectory():
    """Stopped after 3 iterations (the checkpoint waits for the productions in flight and keeps them), resumed
    into a fresh source: the trained prompts of both parts are the uninterrupted run's, none twice, none lost."""
    whole = in_flight_source("tool_agent", split=4)
    straight = [batch.experience.input_ids.tolist() for batch, _ in run(whole, 6)]
    whole.close()

    draws = Draws()
    first = in_flight_source("tool_agent", split=4, draws=draws)
    before = [batch.experience.input_ids.tolist() for batch, _ in run(first, 3)]
    state = {"rollout_source": first.state_dict()}
    consumed, version = draws.consumed, first.service.version
    first.close()

    resumed_draws = Draws()
    resumed_draws.consumed = consumed
    second = in_flight_source("tool_agent", split=4, draws=resumed_draws)
    second.service.version = version
    second.load_state_dict(state)
    after = [batch.experience.input_ids.tolist() for batch, _ in run(second, 3, start=3)]
    second.close()
    assert before + after == straight


# ----- refusals ---------------------------------------------------------------------------------------------
ASYNC = ["rl_config.rollout_resource.num_npus=1", "rl_config.max_head_offpolicyness=2"]


@pytest.mark.parametrize(
    "overrides,words",
    [
        (
            ["rl_config.async_training.in_flight_weight_updates=true"],
            "rl_config.async_training.in_flight_weight_updates: applies to asynchronous rollout",
        ),
        (
            [*ASYNC, "rl_config.async_training.max_staleness=-1"],
            "rl_config.async_training.max_staleness",
        ),
        (
            [*ASYNC, "rl_config.async_training.max_staleness=3"],
            "rl_config.async_training.max_staleness: 3 is above 2, the most a token can lag",
        ),
        (
            [
                *ASYNC,
                "rl_config.async_training.in_flight_weight_updates=true",
                "rl_config.async_training.update_weights_interval=4",
            ],
            "rl_config.async_training.update_weights_interval: 4 is above max_head_offpolicyness + 1 = 3",
        ),
        (
            [*ASYNC, "rl_config.async_training.recompute_kv_cache_after_weight_updates=true"],
            "rl_config.async_training.recompute_kv_cache_after_weight_updates: applies to in-flight weight updates",
        ),
    ],
)  # fmt: skip
def test_async_training_keys_that_do_not_fit_are_refused(capsys, overrides, words):
    err = user_error(capsys, train_ppo.main, ["--config-name", "ppo_tiny_cpu", "dry_run=true", *overrides])
    assert words in err


def test_the_fully_async_twin_plans_in_flight_updates(capsys):
    train_ppo.main(["--config-name", "grpo_tiny_cpu_fully_async", "dry_run=true"])
    out = capsys.readouterr().out
    assert "fully asynchronous: the rollout workers generate up to 2 batch(es) ahead" in out
    assert "a group with a token more than 2 versions old is dropped" in out


# ----- vLLM step by step ------------------------------------------------------------------------------------
STEPPED = textwrap.dedent("""
    import os, sys, threading
    sys.path.insert(0, ".")
    from mindspeed_rl.compat import vllm as compat_vllm
    from mindspeed_rl.config_cls import GenerateConfig, SamplingConfig
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.engines.in_flight import PauseGate
    from mindspeed_rl.rollout.engines.vllm_engine import VllmEngine
    from tests.helpers import tiny_model_config
    m = tiny_model_config(num_layers=1, hidden_size=128, ffn_hidden_size=128, padded_vocab_size=512)
    gen = GenerateConfig(dtype="float32", max_model_len=128, max_num_seqs=8, max_num_batched_tokens=512,
                         gpu_memory_utilization=0.002)
    e = VllmEngine(m, gen, "cpu", 0)
    K = 6  # the update lands after K decode steps

    def request(prompts, seed=5, temperature=0.0, max_tokens=24):
        return RolloutRequest.of(prompts, SamplingConfig(temperature=temperature, max_tokens=max_tokens, seed=seed,
                                                         ignore_eos=True), n=2)

    def new_weights(seed):  # another random model of the same config, HF-named, as the actor's would arrive
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        torch.manual_seed(seed)
        hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(e._dir), torch_dtype=torch.float32)
        return list(hf.state_dict().items())

    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    sampled = e.generate(request(prompts, temperature=1.0))
    gate, version, steps, RECOMPUTE = PauseGate(), [0], [0], None

    def current():
        steps[0] += 1
        if steps[0] == K and RECOMPUTE is not None:
            threading.Thread(target=update).start()
        return version[0]

    def update():
        assert gate.pause(30)
        compat_vllm.load_weights_in_place(e.llm, e.weight_load_method, iter(pending[0]))
        version[0] += 1
        gate.resume(recompute=RECOMPUTE)

    e.step_in_flight(gate, current)
    print("SAME", [o.response_ids for o in e.generate(request(prompts, temperature=1.0))] ==
          [o.response_ids for o in sampled], flush=True)
    for RECOMPUTE, how in ((False, "kept"), (True, "preempt"), (True, "resubmit")):
        if how == "resubmit":
            os.environ["MINDSPEED_RL_VLLM_RECOMPUTE"] = "resubmit"
        e.step_loop = None  # the plain path: the current weights' greedy answers
        greedy = e.generate(request(prompts))
        e.step_in_flight(gate, current)
        steps[0], pending = 0, [new_weights(100 + version[0])]
        crossed = e.generate(request(prompts))
        first_new = [o.versions.index(version[0]) if version[0] in o.versions else -1 for o in crossed]
        prefix_kept = all(o.response_ids[:f] == g.response_ids[:f] for o, f, g in zip(crossed, first_new, greedy))
        # what the new weights continue each answer's prefix with, from scratch (no cache of the old weights)
        e.step_loop = None
        again = [e.generate(RolloutRequest.of([p + o.response_ids[:f]], SamplingConfig(
                     temperature=0.0, max_tokens=24 - f, seed=5, ignore_eos=True)))[0]
                 for p, o, f in zip([p for p in prompts for _ in range(2)], crossed, first_new)]
        e.step_in_flight(gate, current)
        # the first token after the update: its log-prob is the new weights' over a recomputed cache, or not
        gap = max(abs(o.logprobs[f] - a.logprobs[0]) for o, f, a in zip(crossed, first_new, again))
        fresh = all(o.response_ids[f:] == a.response_ids for o, f, a in zip(crossed, first_new, again)) and gap < 1e-4
        print("CROSSED", how, ",".join(map(str, sorted(set(first_new)))), all(len(o.versions) == 24 for o in crossed),
              prefix_kept, fresh, flush=True)
    e.shutdown()
""")


@pytest.mark.slow
def test_vllm_step_by_step_equals_its_generate_and_takes_an_update_between_two_steps():
    """Without an update the step loop's answers are LLM.generate's exactly. An update after the 6th step: every
    answer's earlier tokens are the old weights' (version 0) and the rest version 1; with the KV cache recomputed
    (vLLM's preemption, or abort and resubmit) the rest is exactly what the new weights continue the prefix with."""
    out = subprocess.run([sys.executable, "-c", STEPPED], cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith(("SAME", "CROSSED"))]
    assert out.returncode == 0 and len(lines) == 4, out.stdout[-2000:] + out.stderr[-3000:]
    assert lines[0] == "SAME True"
    for line, how in zip(lines[1:], ("kept", "preempt", "resubmit")):
        _, name, first_new, whole, prefix_kept, fresh = line.split(" ")
        assert name == how and whole == "True" and prefix_kept == "True", line
        assert all(0 < int(f) < 24 for f in first_new.split(",")), line  # the update landed mid-answer
        # kept: the answer goes on over the old weights' keys and values, which a recomputation would not
        assert fresh == ("False" if how == "kept" else "True"), line


# ----- end to end ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("without_shared_ray")  # its run starts a Ray cluster of its own
def test_the_fully_async_twin_trains_with_updates_landing_in_flight(tmp_path, demo_assets):
    """configs/grpo_tiny_cpu_fully_async for 3 iterations, its rollout engine at infer TP 2 (two ranks that must hold
    at the same step) with the KV cache recomputed at each update: whole batches, tokens at most 2 versions old,
    answers whose tokens come from two versions (the updates landed while they were generated), and the tokens
    sampled after an update carry exactly the log-probs the trainer's weights give them (batch-invariant fp32: 0)."""
    import json
    import os

    args = [
        sys.executable, os.path.join(ROOT, "cli", "train_ppo.py"), "--config-name", "grpo_tiny_cpu_fully_async",
        f"megatron_training.tokenizer_name_or_path={demo_assets['tokenizer']}",
        f"megatron_training.data_path={demo_assets['data_prefix']}",
        "megatron_training.test_data_path=null", "rl_config.test_freq=0", "rl_config.val_before_train=false",
        "megatron_training.train_iters=3", f"rl_config.log_dir={tmp_path}/logs", f"actor_config.save={tmp_path}/ckpt",
        "rl_config.rollout_resource.num_npus=2", "generate_config.infer_tensor_parallel_size=2",
        "rl_config.async_training.recompute_kv_cache_after_weight_updates=true",
    ]  # fmt: skip
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "fully asynchronous" in out.stdout and "iter 3/3" in out.stdout
    (run_dir,) = [os.path.join(tmp_path, "logs", d) for d in os.listdir(tmp_path / "logs")]
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert len(rows) == 3
    assert all(r["rollout/staleness_max"] <= 2 for r in rows)
    assert all(0.0 <= r["timing/engine_idle_share"] <= 1.0 for r in rows[1:])
    assert max(r["rollout/mixed_version_share"] for r in rows) > 0, [r["rollout/mixed_version_share"] for r in rows]
    assert rows[-1]["rollout/staleness_mean"] < 2  # tokens of the newest version among them
    assert all(r["rollout/fresh_logprob_diff_max"] < 1e-4 for r in rows), [
        r["rollout/fresh_logprob_diff_max"] for r in rows
    ]


# ----- the service: pause every engine, load, resume every engine -------------------------------------------------
@pytest.fixture(scope="module")
def stepping_workers(without_shared_ray):
    """Threaded Ray actors: two rollout engines over stepping engines (engine 1's load fails when told), one sender."""
    import ray

    from tests.rollout_fakes import stepping_fleet

    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})

    def start(fail_load=False, step_s=0.01):
        return stepping_fleet(fail_load=fail_load, step_s=step_s, restarts=False)

    yield start
    ray.shutdown()


def test_an_in_flight_update_pauses_every_engine_loads_all_and_only_then_resumes_any(stepping_workers):
    import ray

    from mindspeed_rl.config_cls import SamplingConfig
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.service import DisaggregatedRollout, InFlightUpdates

    actor, rollout = stepping_workers()
    service = DisaggregatedRollout(actor, rollout, InFlightUpdates(pause_timeout_s=10))
    service.update_weights(0)
    handle = service.submit(RolloutRequest.of([[1], [2], [3], [4]], SamplingConfig(max_tokens=40), n=2))
    time.sleep(0.15)  # a dozen steps in
    service.update_weights(1)
    outputs = service.collect(handle).outputs
    assert len(outputs) == 8 and service.engine_version == 1
    for out in outputs:  # the old version's tokens, then the new one's
        first = out.versions.index(1)
        assert 0 < first < 40 and out.versions == [0] * first + [1] * (40 - first)
    logs = ray.get(rollout.call_async("log"))
    loads = [t for events, _ in logs for rank, what, t in events if what == "load"]
    resumes = [t for events, _ in logs for rank, what, t in events if what == "resume"]
    assert len(loads) == 4 and len(resumes) == 4  # the start's push and the update's, on both ranks
    update_loads = sorted(loads)[2:]
    # a load takes 50 ms from its log line: no rank resumes before the slower rank's load is done
    assert min(t for t in resumes if t > min(update_loads)) > max(update_loads) + 0.045


def test_a_load_that_fails_on_one_engine_stops_the_update_with_no_engine_resumed(stepping_workers):
    import ray

    from mindspeed_rl.rollout.service import DisaggregatedRollout, InFlightUpdates

    actor, rollout = stepping_workers(fail_load=True)
    service = DisaggregatedRollout(actor, rollout, InFlightUpdates(pause_timeout_s=10))
    with pytest.raises(Exception, match="engine 1: the weights did not load"):
        service.update_weights(0)
    logs = ray.get(rollout.call_async("log"))
    assert all(paused for _, paused in logs)  # both gates closed: neither engine serves a mix of versions
    assert not [what for events, _ in logs for _, what, _ in events if what == "resume"]


def test_an_engine_stuck_in_a_step_stops_the_update_naming_it_and_the_key(stepping_workers):
    from mindspeed_rl.config_cls import SamplingConfig
    from mindspeed_rl.protocol import RolloutRequest
    from mindspeed_rl.rollout.service import DisaggregatedRollout, InFlightUpdates

    actor, rollout = stepping_workers(step_s=2.0)
    service = DisaggregatedRollout(actor, rollout, InFlightUpdates(pause_timeout_s=0.3))
    service.update_weights(0)
    service.submit(RolloutRequest.of([[1], [2]], SamplingConfig(max_tokens=40), n=1))
    time.sleep(0.2)
    with pytest.raises(Exception, match=r"rollout engine 0 \(rank 0\) did not pause .*pause_timeout_s = 0.3 s"):
        service.update_weights(1)


# ----- correction of mixed-version answers ------------------------------------------------------------------------
def test_a_mixed_version_answer_is_clipped_around_the_proximal_policy_and_weighted_to_its_behaviour():
    """One answer of three tokens, the first sampled by version 1 and the others by version 2, trained at version 2
    (docs/algorithms.md, "Mixed-version trajectories"); the loss by hand:
        w   = [min(exp(-0.8 + 1.0), 2), 1, 1] = [1.22140, 1, 1]      (only the stale token is reweighted)
        r   = exp(log pi - log pi_prox) = [exp(0.3), exp(0), exp(-0.2)] = [1.34986, 1, 0.81873]
        L_t = w_t * max(-A r_t, -A clip(r_t, 0.8, 1.2)), A = 1:  [-1.2 * 1.22140, -1, -0.81873]
        L   = token mean = (-1.46568 - 1 - 0.81873) / 3 = -1.09480"""
    from types import SimpleNamespace

    import torch

    from mindspeed_rl.algorithms.losses import Clip, vanilla_policy_loss
    from mindspeed_rl.trainer.ppo.ppo_trainer import PPOTrainer

    behaviour = torch.tensor([[-1.0, -0.5, -0.7]])  # what each token's sampling version gave it (the engine's)
    proximal = torch.tensor([[-0.8, -0.6, -0.7]])  # the actor's weights before the update (old log-probs)
    current = torch.tensor([[-0.5, -0.6, -0.9]])
    mask = torch.ones(1, 3)
    exp = SimpleNamespace(
        old_log_probs=proximal, rollout_log_probs=behaviour, loss_mask=mask, policy_version=torch.tensor([[1, 2, 2]])
    )
    exp.set = lambda name, value: setattr(exp, name, value)
    trainer = SimpleNamespace(
        rl=SimpleNamespace(rollout_correction=SimpleNamespace(rollout_is_threshold=2.0)),
        algorithm=SimpleNamespace(rollout_is=None),
        off_policy=True,
        rollout_service=SimpleNamespace(version=2),
    )
    PPOTrainer.correct_rollout(trainer, exp)
    assert torch.allclose(exp.rollout_is_weights, torch.tensor([[1.22140, 1.0, 1.0]]), atol=1e-5)
    loss, _ = vanilla_policy_loss(
        current, proximal, torch.ones(1, 3), mask, Clip(0.2, 0.2), weights=exp.rollout_is_weights
    )
    assert abs(float(loss) - (-1.09480)) < 1e-4
