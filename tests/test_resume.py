"""Exact resume with finetune=false: iterations 3 and 4 resumed from the checkpoints of iteration 2 == the straight
run's (rewards, losses, final weights), when the run stopped between the actor's and the critic's save of iteration 3;
a save killed half-way never becomes the latest checkpoint. The runs put the critic beside the actor (blocking
false: values beside the reference's forward, the two updates at once, one thread each). The straight run also
profiles iteration 2 (profiler_config): traces of the chosen stages only, and the report's top-operator tables."""

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from mindspeed_rl.checkpoint import megatron_layout as ml
from mindspeed_rl.features import load_ppo_config
from tests.helpers import checkpoints_up_to

COMPARED = (
    "critic/score/mean",
    "actor/pg_loss",
    "critic/vf_loss",
    "actor/kl_loss",
    "grad_norm",
    "response_length/mean",
    "critic/advantages/mean",
)


def cfg_for(root, paths, name, iters, **extra):
    overrides = [
        f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
        f"megatron_training.data_path={paths['data_prefix']}",
        f"rl_config.log_dir={root}/logs",
        "megatron_training.test_data_path=null",
        "rl_config.test_freq=0",
        "rl_config.val_before_train=false",
        f"megatron_training.train_iters={iters}",
        "megatron_training.save_interval=2",
        "megatron_training.global_batch_size=8",
        "rl_config.mini_batch_size=32",
        "rl_config.shuffle_mini_batch=true",
        "rl_config.init_kl_coef=0.01",
        "rl_config.blocking=false",
        f"actor_config.save={root}/{name}/actor",
        f"critic_config.save={root}/{name}/critic",
        "actor_config.no_load_optim=false",
        "actor_config.no_load_rng=false",
        "actor_config.save_hf=false",  # (the HF copy beside each checkpoint: tests/test_save_hf.py)
        "critic_config.no_load_optim=false",
        "critic_config.no_load_rng=false",
    ]
    overrides += [f"{k}={v}" for k, v in extra.items()]
    return load_ppo_config("ppo_tiny_cpu", overrides)


def check_profiles(folder):
    """Traces of the chosen stages in the chosen iteration only, each with its top operators; the run report's
    profiler section."""
    actor, critic = os.path.join(folder, "actor", "rank0"), os.path.join(folder, "critic", "rank0")
    traces = sorted(f for f in os.listdir(actor) if f.endswith(".json"))
    assert "actor_update_iter2_1.json" in traces and all("_iter2_" in f for f in traces), traces
    assert {f.split("_iter")[0] for f in traces} == {"actor_update", "actor_generate"}
    assert sorted(f for f in os.listdir(critic) if f.endswith(".json")) == ["critic_update_iter2_1.json"]
    with open(os.path.join(actor, "actor_update_iter2_1.json")) as fh:
        assert json.load(fh)["traceEvents"]  # a Chrome trace with events
    with open(os.path.join(actor, "summary.jsonl")) as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == len(traces) and all(r["top"] and r["top"][0]["self_ms"] > 0 for r in rows)
    with open(os.path.join(os.path.dirname(folder), "report.html"), encoding="utf-8") as fh:
        report = fh.read()
    assert "Profiler: top operators per stage" in report and "critic critic_update: 1 traced call(s)" in report


def weights(folder):
    return ml.load_rank(folder, 0, 0, mmap=False)["model"]


def for_each_iteration_the_critic_ran_beside_the_actor(timeline: str, iterations: int) -> None:
    """The run's timeline (timeline.jsonl): in every iteration the critic's values overlap the reference's
    log-probs and its update the actor's, for all of the shorter call (in turn they would not overlap at all). The
    spans, not the phases' seconds against the iteration's: a slow reward or save outweighs the overlap's gain."""
    with open(timeline, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == iterations
    for row in rows:
        spans = {phase: (start, end) for _, phase, start, end in row["spans"]}
        for actor, critic in (
            ("timing/reference_model", "timing/critic_model"),
            ("timing/update", "timing/update_critic"),
        ):
            (a0, a1), (c0, c1) = spans[actor], spans[critic]
            shorter = min(a1 - a0, c1 - c0)
            assert shorter > 0 and min(a1, c1) - max(a0, c0) >= 0.99 * shorter, (row["iteration"], actor, critic, spans)


@pytest.mark.slow
def test_resume_reproduces_the_straight_run(tmp_path, demo_assets):
    from mindspeed_rl.trainer.launch import train

    root, paths = str(tmp_path), demo_assets
    profiled = {  # the straight run also profiles iteration 2's update and generation, and the critic's update
        "+profiler_config.integrated.profile": "true",
        "+profiler_config.integrated.stage": "[actor_update,actor_generate]",
        "+profiler_config.integrated.profile_step_start": 2,
        "+profiler_config.integrated.profile_step_end": 3,
        "+profiler_config.critic.profile": "true",
        "+profiler_config.critic.stage": "critic_update",
        "+profiler_config.critic.profile_step_start": 2,
        "+profiler_config.critic.profile_step_end": 3,
    }
    straight = train(cfg_for(root, paths, "straight", 4, **{"megatron_training.save_interval": 1, **profiled}))
    (run_dir,) = glob.glob(f"{root}/logs/*/")
    for_each_iteration_the_critic_ran_beside_the_actor(os.path.join(run_dir, "timeline.jsonl"), len(straight))
    check_profiles(os.path.join(run_dir, "profiler"))
    # what a driver leaves when it dies after the actor committed iteration 3 and before the critic did: the
    # straight run's checkpoints up to iteration 3, the critic's iteration 3 still its staging folder and its
    # tracker at 2
    checkpoints_up_to(f"{root}/straight/actor", f"{root}/split/actor", 3)
    checkpoints_up_to(f"{root}/straight/critic", f"{root}/split/critic", 3, tracker=2)
    os.replace(f"{root}/split/critic/iter_0000003", f"{root}/split/critic/iter_0000003.tmp")
    resume = {
        "actor_config.finetune": "false",
        "critic_config.finetune": "false",
        "actor_config.load": f"{root}/split/actor",
        "critic_config.load": f"{root}/split/critic",
    }
    second = train(cfg_for(root, paths, "split", 4, **resume))
    assert [m["iteration"] for m in second] == [3, 4]  # both roles from iteration 2, not actor 3 + critic 2
    for a, b in zip(straight[2:], second):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["iteration"], key)
    for role in ("actor", "critic"):
        assert ml.read_tracker(f"{root}/straight/{role}") == 4 == ml.read_tracker(f"{root}/split/{role}")
        wa, wb = weights(f"{root}/straight/{role}"), weights(f"{root}/split/{role}")
        worst = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
        assert worst <= 1e-6, (role, worst)
    state = ml.load_rank(f"{root}/split/actor", 0, 0)["trainer_state"]
    assert state["iteration"] == 4 and state["consumed_samples"] == 32
    resume_at_tp2(root, paths, resume)


def resume_at_tp2(root, paths, resume):
    """The checkpoint of iteration 4 at TP 1, resumed at TP 2: pre-flight refuses it with one reshard
    command per role (paths quoted); those commands keep iteration, trainer state and optimizer, and the
    resumed run goes on at iteration 5 with the data position of the checkpoint."""
    import shlex

    from cli import convert_ckpt
    from mindspeed_rl.trainer.launch import train
    from mindspeed_rl.trainer.startup.preflight import preflight
    from mindspeed_rl.utils.cli import UserError

    tp2 = {
        "actor_config.tensor_model_parallel_size": 2,
        "critic_config.tensor_model_parallel_size": 2,
        "rl_config.actor_resource.num_npus": 2,
        "rl_config.critic_resource.num_npus": 2,
    }
    with pytest.raises(UserError) as refused:
        preflight(cfg_for(root, paths, "tp2", 5, **resume, **tp2))
    commands = [line.split("Reshard it: ", 1)[1] for line in str(refused.value).splitlines() if "Reshard it: " in line]
    assert len(commands) == 2, str(refused.value)
    for command in commands:
        argv = shlex.split(command)
        assert argv[:2] == ["python", "cli/convert_ckpt.py"] and convert_ckpt.main(argv[2:]) == 0
    resharded = {key: f"{value}_tp2pp1" for key, value in resume.items() if key.endswith(".load")}
    for folder in resharded.values():
        assert ml.read_tracker(folder) == 4 and ml.full_layout_of(f"{folder}/iter_0000004") == (2, 1, 1)
    after = train(cfg_for(root, paths, "tp2", 5, **{**resume, **resharded}, **tp2))
    assert [m["iteration"] for m in after] == [5]
    state = ml.load_rank(f"{root}/tp2/actor", 0, 0, expected=(2, 1))["trainer_state"]
    assert state["iteration"] == 5 and state["consumed_samples"] == 40


def test_sigkill_in_the_middle_of_a_save_keeps_the_previous_checkpoint(tmp_path):
    """A process has written iteration 20's rank file and is waiting for the other ranks when it is killed."""
    ckpt = str(tmp_path / "ckpt")
    ml.begin_save(ckpt, 10)
    ml.write_rank(ckpt, 10, 0, 0, 1, {"model": {"w": torch.ones(3)}, "iteration": 10})
    ml.commit_save(ckpt, 10, 1)
    code = textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {os.getcwd()!r})
        from mindspeed_rl.checkpoint import megatron_layout as ml
        ml.begin_save({ckpt!r}, 20)
        ml.write_rank({ckpt!r}, 20, 0, 0, 2, {{"model": {{"w": torch.zeros(3)}}, "iteration": 20}})
        print("written", flush=True)
        time.sleep(60)   # the barrier: the other rank never arrives
        ml.commit_save({ckpt!r}, 20, 2)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ml.read_tracker(ckpt) == 10
    payload = ml.load_rank(ckpt, 0, 0, expected=(1, 1))
    assert payload["iteration"] == 10 and torch.equal(payload["model"]["w"], torch.ones(3))
    ml.begin_save(ckpt, 20)  # the next save clears the leftover staging folder
    assert not os.path.exists(ml.staging_dir(ckpt, 20))
