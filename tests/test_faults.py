"""Fail fast, fail clear, lose nothing, run nothing, kill nothing: one test per fault a new user hit.

Every user error exits 2 with one message naming the key, file or flag and no traceback; faults during
training stop cleanly with their own exit codes (docs/operations.md, "When things go wrong").
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from cli import convert_ckpt, preprocess_data, train_ppo
from mindspeed_rl.checkpoint import megatron_layout as ml
from mindspeed_rl.demo.tiny_hf import build_hf_model, build_tokenizer
from mindspeed_rl.features import load_ppo_config
from tests.helpers import tiny_model_config, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# its own Ray clusters (a test starts one in this process)
pytestmark = pytest.mark.usefixtures("without_shared_ray")


@pytest.fixture(scope="module")
def assets(tmp_path_factory, demo_assets):
    return tmp_path_factory.mktemp("faults"), demo_assets


def train_args(root, paths, *extra):
    return [
        "--config-name",
        "ppo_tiny_cpu",
        f"megatron_training.tokenizer_name_or_path={paths['tokenizer']}",
        f"megatron_training.data_path={paths['data_prefix']}",
        f"rl_config.log_dir={root}/logs",
        f"megatron_training.test_data_path={paths['test_prefix']}",
        f"actor_config.save={root}/ckpt/actor",
        f"critic_config.save={root}/ckpt/critic",
        *extra,
    ]


def user_error(capsys, fn, args):
    """Run a CLI main in-process: it must return 2 with a one-line message and no traceback."""
    rc = fn(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    return err


# ----- the validator -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override,words",
    [
        ("rl_config.verifier_weight=[nan]", "rl_config.verifier_weight[0]: got nan, expected a finite number"),
        ("actor_config.lr=inf", "actor_config.lr: got inf"),
        ("actor_config.lr=1e6", "actor_config.lr: got 1000000.0, must be <= 1"),
        ("critic_config.clip_grad=-inf", "critic_config.clip_grad: got -inf"),
        ("rl_config=null", "rl_config: is null"),
        ("generate_config=null", "generate_config: is null"),
        ("generate_config.sampling_config=null", "generate_config.sampling_config: is null"),
        ("rl_config.verifier_function=[]", "rl_config.verifier_function: is empty"),
        (
            "rl_config.use_integrated_worker=false",
            "rl_config.use_integrated_worker: false (actor, reference and critic "
            "in workers on devices of their own) is not implemented",
        ),
        (
            "actor_config.lora_target_modules=[q_proj]",
            "actor_config.lora_target_modules: ['q_proj']: choose among "
            "linear_qkv, linear_proj, linear_fc1, linear_fc2",
        ),
        ("actor_config.lora_r=-1", "actor_config.lora_r"),
        (
            "megatron_training.seq_length=60",
            "megatron_training.seq_length: 60 is below rl_config.max_prompt_length + sampling_config.max_tokens",
        ),
        (
            "generate_config.max_model_len=4096",
            "generate_config.max_model_len: 4096 exceeds the actor model's max_position_embeddings 1024",
        ),
    ],
)
def test_bad_values_are_refused_before_anything_starts(capsys, override, words):
    err = user_error(capsys, train_ppo.main, ["--config-name", "ppo_tiny_cpu", "dry_run=true", override])
    assert words in err


@pytest.mark.parametrize(
    "overrides,words",
    [
        (
            ["rl_config.partial_rollout_max_split=2", "rl_config.rollout_function=tests.test_agent_loop:solve"],
            "rl_config.partial_rollout_max_split: the rollout function 'tests.test_agent_loop:solve' is a whole-batch",
        ),
        (["rl_config.partial_rollout_max_split=17"], "rl_config.partial_rollout_max_split: 17 chunks of a 16-token"),
        (
            ["rl_config.partial_rollout_max_split=4", "generate_config.sampling_config.min_tokens=5"],
            "generate_config.sampling_config.min_tokens: 5 is above the partial-rollout chunk of 4 tokens",
        ),
        (
            ["rl_config.max_head_offpolicyness=1"],
            "rl_config.max_head_offpolicyness: asynchronous rollout needs rollout workers of their own",
        ),
        (
            ["rl_config.rollout_resource.num_npus=3", "generate_config.infer_tensor_parallel_size=2"],
            "generate_config.infer_tensor_parallel_size: 2 does not divide the rollout workers' 3 devices",
        ),
        (
            ["rl_config.max_head_offpolicyness=1000", "rl_config.rollout_resource.num_npus=1"],
            "rl_config.max_head_offpolicyness: 1000 is above 8: the rollout workers would generate 1001 batches",
        ),
        (
            [
                "rl_config.max_head_offpolicyness=4",
                "rl_config.rollout_resource.num_npus=1",
                "megatron_training.train_iters=4",
            ],
            "rl_config.max_head_offpolicyness: 4 is not below megatron_training.train_iters 4: the first "
            "iteration would submit 5 batches",
        ),
    ],
)
def test_rollout_mode_keys_that_do_not_fit_together_are_refused(capsys, overrides, words):
    err = user_error(capsys, train_ppo.main, ["--config-name", "ppo_tiny_cpu", "dry_run=true", *overrides])
    assert words in err


def test_the_async_lag_bound_accepts_up_to_8_below_train_iters():
    from mindspeed_rl.config_cls.base import ConfigError
    from mindspeed_rl.features.async_rollout import MAX_HEAD_OFFPOLICYNESS, check_async_lag

    check_async_lag(MAX_HEAD_OFFPOLICYNESS, MAX_HEAD_OFFPOLICYNESS + 1)  # the largest accepted
    check_async_lag(1, 2)
    for lag, iters in ((MAX_HEAD_OFFPOLICYNESS + 1, 10_000), (2, 2), (1, 1)):
        with pytest.raises(ConfigError, match="rl_config.max_head_offpolicyness"):
            check_async_lag(lag, iters)


def test_prompt_longer_than_the_training_sequence_is_refused(capsys):
    err = user_error(
        capsys,
        train_ppo.main,
        [
            "--config-name",
            "ppo_tiny_cpu",
            "dry_run=true",
            "rl_config.max_prompt_length=200",
            "generate_config.max_model_len=512",
        ],
    )
    assert "rl_config.max_prompt_length: 200 exceeds megatron_training.seq_length 96" in err


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "broken.yaml"
    bad.write_text("megatron_training:\n  seed: [1\n")
    err = user_error(capsys, train_ppo.main, ["--config-name", str(bad)])
    assert f"{bad}, line 3" in err and "not valid YAML" in err


# ----- pre-flight: before Ray starts ---------------------------------------------------------------------------
def fake_checkpoint(folder, tracker="release", iteration_dir="release", truncate=False, model=None, **extra):
    rank_dir = os.path.join(folder, iteration_dir, "mp_rank_00")
    os.makedirs(rank_dir, exist_ok=True)
    path = os.path.join(rank_dir, "model_optim_rng.pt")
    torch.save(
        {"model": {"w": torch.ones(1000)}, "iteration": 0, **({"config": {"model": model}} if model else {}), **extra},
        path,
    )
    if truncate:
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) // 2)
    with open(os.path.join(folder, ml.TRACKER), "w") as fh:
        fh.write(tracker)
    return path


@pytest.mark.parametrize(
    "case",
    [
        "unwritable_save",
        "tracker_abc",
        "missing_iteration",
        "truncated_file",
        "truncated_idx",
        "weight_load_env",
        "other_model",
        "missing_optimizer_shard",
        "critic_never_saved",
        "roles_apart_without_common",
        "folder_locked",
        "both_roles_other_tp",
        "recorded_reference_other_tp",
        "resume_from_interrupted_save_only",
        "resume_from_empty_folder",
        "resume_from_missing_folder",
    ],
)
def test_preflight_names_the_path_in_seconds_without_starting_ray(assets, tmp_path, capsys, case, monkeypatch):
    import ray

    root, paths = assets
    extra = []
    if case == "unwritable_save":
        blocker = tmp_path / "a_file"
        blocker.write_text("not a folder")
        extra, words = (
            [f"actor_config.save={blocker}/ckpt"],
            f"actor_config.save: cannot write checkpoints to {blocker}/ckpt",
        )
    elif case == "tracker_abc":
        fake_checkpoint(str(tmp_path / "load"), tracker="abc")
        extra, words = [f"actor_config.load={tmp_path}/load"], "expected 'release' or an iteration number, found 'abc'"
    elif case == "missing_iteration":
        fake_checkpoint(str(tmp_path / "load"), tracker="7")
        extra, words = [f"actor_config.load={tmp_path}/load"], "the tracker names iter_0000007, which does not exist"
    elif case == "truncated_file":
        path = fake_checkpoint(str(tmp_path / "load"), truncate=True)
        extra, words = [f"actor_config.load={tmp_path}/load"], f"{path} is truncated or corrupt"
    elif case == "other_model":
        model = load_ppo_config("ppo_tiny_cpu").actor.model
        fake_checkpoint(
            str(tmp_path / "load"), model={"hidden_size": model.hidden_size * 2, "num_layers": model.num_layers}
        )
        extra = [f"actor_config.load={tmp_path}/load"]
        words = (
            f"holds another model than actor_config.model: hidden_size {model.hidden_size * 2} "
            f"(run: {model.hidden_size})"
        )
    elif case == "missing_optimizer_shard":
        fake_checkpoint(str(tmp_path / "actor"), tracker="2", iteration_dir="iter_0000002")
        extra = [
            f"actor_config.load={tmp_path}/actor",
            "actor_config.finetune=false",
            "actor_config.no_load_optim=false",
            "actor_config.use_distributed_optimizer=true",
        ]
        words = f"{tmp_path}/actor/iter_0000002/mp_rank_00/distrib_optim_dp000.pt is missing"
    elif case == "critic_never_saved":
        fake_checkpoint(str(tmp_path / "actor"), tracker="2", iteration_dir="iter_0000002")
        (tmp_path / "critic").mkdir()
        extra = [
            f"actor_config.load={tmp_path}/actor",
            "actor_config.finetune=false",
            "critic_config.finetune=false",
            f"critic_config.load={tmp_path}/critic",
        ]
        words = "critic's folder " + f"{tmp_path}/critic holds no checkpoint: resume every role from the same run"
    elif case == "roles_apart_without_common":
        fake_checkpoint(str(tmp_path / "actor"), tracker="3", iteration_dir="iter_0000003")
        fake_checkpoint(str(tmp_path / "critic"), tracker="2", iteration_dir="iter_0000002")
        extra = [
            f"actor_config.load={tmp_path}/actor",
            "actor_config.finetune=false",
            "critic_config.finetune=false",
            f"critic_config.load={tmp_path}/critic",
        ]
        words = f"(actor 3, critic 2: a save was interrupted) and {tmp_path}/actor no longer holds iter_0000002"
    elif case == "both_roles_other_tp":
        for role in ("my actor", "critic"):  # saved at TP 2, the run is TP 1
            fake_checkpoint(str(tmp_path / role), tracker="2", iteration_dir="iter_0000002")
            shutil.copytree(
                tmp_path / role / "iter_0000002" / "mp_rank_00", tmp_path / role / "iter_0000002" / "mp_rank_01"
            )
        extra = [
            f"actor_config.load={tmp_path}/my actor",
            "actor_config.finetune=false",
            "critic_config.finetune=false",
            f"critic_config.load={tmp_path}/critic",
        ]
        words = (
            f"--load-dir '{tmp_path}/my actor' --save-dir '{tmp_path}/my actor_tp1pp1'",
            f"critic_config.load: {tmp_path}/critic is saved with TP=2, PP=1, EP=1 but the run uses TP=1",
        )
    elif case == "recorded_reference_other_tp":  # the actor was resharded, the folder its reference came from not
        fake_checkpoint(str(tmp_path / "origin"), tracker="release")
        shutil.copytree(tmp_path / "origin" / "release" / "mp_rank_00", tmp_path / "origin" / "release" / "mp_rank_01")
        fake_checkpoint(
            str(tmp_path / "actor"),
            tracker="2",
            iteration_dir="iter_0000002",
            trainer_state={"ref_from": str(tmp_path / "origin")},
        )
        extra = [f"actor_config.load={tmp_path}/actor", "actor_config.finetune=false"]
        words = (
            f"the reference recorded in {tmp_path}/actor (trainer_state.ref_from): {tmp_path}/origin is saved "
            "with TP=2",
            "then set rl_config.integrated_mode_config.ref_model_load_path to the resharded folder",
        )
    elif case == "folder_locked":
        from mindspeed_rl.utils.run_lock import LOCK_NAME

        (tmp_path / "ckpt" / "critic").mkdir(parents=True)
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (tmp_path / "ckpt" / "critic" / LOCK_NAME).write_text(
            json.dumps({"pid": holder.pid, "host": __import__("socket").gethostname(), "started": time.time()})
        )
        extra, words = [], f"critic_config.save: {tmp_path}/ckpt/critic is used by a live run (pid {holder.pid}"
    elif case.startswith("resume_from"):  # finetune false never silently becomes a new run
        folder = tmp_path / "saves"
        if case == "resume_from_interrupted_save_only":  # a first run stopped in its first save
            ml.begin_save(str(folder), 2)
            ml.write_rank(str(folder), 2, 0, 0, 1, {"model": {}, "iteration": 2})
            (folder / "iter_0000002.tmp" / "mp_rank_00" / "model_optim_rng.pt.part").write_bytes(b"half")
            found = "it holds only interrupted saves (iter_0000002.tmp), no completed one"
        elif case == "resume_from_empty_folder":
            folder.mkdir()
            found = "it is empty"
        else:
            found = ""
        extra = [f"actor_config.load={folder}", "actor_config.finetune=false"]
        refused = f"actor_config.load: actor_config.finetune is false (resume), but {folder} holds no complete"
        words = f"{refused} checkpoint: {found}. To resume" if found else f"folder '{folder}' does not exist, and"
    elif case == "weight_load_env":
        monkeypatch.setenv("MINDSPEED_RL_VLLM_WEIGHT_LOAD", "reload")
        words = "MINDSPEED_RL_VLLM_WEIGHT_LOAD='reload': expected one of auto, reload_weights, load_weights"
    else:
        data = tmp_path / "data"
        shutil.copytree(os.path.dirname(paths["data_prefix"]), data)
        idx = data / (os.path.basename(paths["data_prefix"]) + "_packed_input_ids_document.idx")
        idx.write_bytes(idx.read_bytes()[:40])
        extra, words = (
            [f"megatron_training.data_path={data}/{os.path.basename(paths['data_prefix'])}"],
            f"{idx} is truncated",
        )
    start = time.perf_counter()
    try:
        err = user_error(capsys, train_ppo.main, train_args(tmp_path, paths, *extra))
    finally:
        if case == "folder_locked":
            holder.kill()
    assert all(w in err for w in words) if isinstance(words, tuple) else words in err, err
    assert time.perf_counter() - start < 30 and not ray.is_initialized()
    if case == "folder_locked":  # the locks this run took on its other folders are gone again
        assert not [p for p in glob.glob(f"{tmp_path}/**/{LOCK_NAME}", recursive=True) if "critic" not in p]


# ----- safe loading --------------------------------------------------------------------------------------------
class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "pwned"
    path = fake_checkpoint(str(tmp_path / "mg"))
    torch.save({"model": {}, "config": RunsACommand(str(marker))}, path)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    err = user_error(
        capsys,
        convert_ckpt.main,
        [
            "--load-model-type",
            "mg",
            "--save-model-type",
            "hf",
            "--load-dir",
            str(tmp_path / "mg"),
            "--save-dir",
            str(tmp_path / "hf"),
        ],
    )
    assert not marker.exists()
    assert path in err and "refused to load" in err
    with pytest.raises(ml.CheckpointError, match="refused to load"):
        ml.load_rank(str(tmp_path / "mg"), 0, 0)


def test_shipped_configs_do_not_trust_remote_code():
    for name in os.listdir(os.path.join(ROOT, "configs")):
        if name.endswith(".yaml") and not name.startswith(("rm_", "sft_", "dpo_")):  # those stages start no vLLM
            assert not load_ppo_config(name[:-5]).generate.trust_remote_code, name


# ----- non-finite losses and weights ---------------------------------------------------------------------------
def test_non_finite_steps_are_skipped_counted_and_never_saved(tmp_path):
    from mindspeed_rl.checkpoint.engine_io import save_engine
    from mindspeed_rl.models.engine import MegatronEngine
    from mindspeed_rl.protocol import Experience, MiniBatch
    from mindspeed_rl.utils import dist
    from mindspeed_rl.workers.base_worker import train_on_mini_batches
    from tests.helpers import make_batch, sft_loss, tiny_role

    dist.init_distributed()
    try:
        dist.init_model_parallel(seed=1)
        engine = MegatronEngine(tiny_role(), head="lm", trainable=True, total_steps=10)
        before = {k: v.clone() for k, v in engine.named_weights()}
        batch = make_batch(4, 12)
        rows = Experience(
            prompt_width=4,
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            response_mask=batch["attention_mask"][:, 4:],
        )

        def nan_loss(rows, normaliser):
            return lambda outputs, mb: (sft_loss(outputs, mb)[0] * float("nan"), {})

        metrics = train_on_mini_batches(engine, [MiniBatch(rows, 1.0)] * 2, nan_loss, 2, "actor")
        assert metrics["actor/skipped_steps"] == 2 and metrics["actor/nonfinite_streak"] == 2
        assert all(torch.equal(before[k], v) for k, v in engine.named_weights())  # no step was taken
        metrics = train_on_mini_batches(
            engine, [MiniBatch(rows, 1.0)], lambda r, n: lambda o, mb: sft_loss(o, mb), 2, "actor"
        )
        assert metrics["actor/skipped_steps"] == 0 and metrics["actor/nonfinite_streak"] == 0
        save_engine(engine, str(tmp_path / "ckpt"), 1)
        with torch.no_grad():
            next(iter(engine.unwrapped().parameters())).view(-1)[0] = float("nan")
        with pytest.raises(ml.CheckpointError, match="hold NaN or Inf"):
            save_engine(engine, str(tmp_path / "ckpt"), 2)
        assert ml.read_tracker(str(tmp_path / "ckpt")) == 1  # the good checkpoint stays the latest
    finally:
        dist.destroy()


def test_a_streak_of_skipped_steps_stops_the_run_with_exit_3(monkeypatch, capsys):
    from types import SimpleNamespace

    from mindspeed_rl.trainer import launch
    from mindspeed_rl.trainer.ppo.ppo_trainer import PPOTrainer
    from mindspeed_rl.trainer.runtime.failures import EXIT_NONFINITE
    from mindspeed_rl.trainer.runtime.guards import NonFiniteStop

    cfg = load_ppo_config("ppo_tiny_cpu", ["rl_config.max_nonfinite_steps=2"])
    trainer = SimpleNamespace(rl=cfg.rl, iteration=5, cfg=cfg)
    with pytest.raises(NonFiniteStop, match="critic's last 2 optimizer steps"):
        PPOTrainer.after_iteration(trainer, {"actor/nonfinite_streak": 0.0, "critic/nonfinite_streak": 2.0})

    def stopped(_):
        raise NonFiniteStop("the actor's last 3 optimizer steps had a NaN/Inf loss or gradient")

    monkeypatch.setattr(launch, "train", stopped)
    assert launch.run(cfg) == EXIT_NONFINITE
    assert "stopped: the actor's last 3" in capsys.readouterr().err


def test_a_collapsed_policy_is_not_saved_and_stops_the_run_after_max_collapsed_iterations(capsys):
    """lr=0.5: entropy and gradient norm exactly 0 from iteration 3 on; the guard saves none of those."""
    from types import SimpleNamespace

    from mindspeed_rl.trainer.ppo.ppo_trainer import PPOTrainer
    from mindspeed_rl.trainer.runtime.guards import NonFiniteStop

    cfg = load_ppo_config("ppo_tiny_cpu", ["rl_config.max_collapsed_iterations=3", "megatron_training.save_interval=1"])
    saved = []
    trainer = SimpleNamespace(
        rl=cfg.rl, cfg=cfg, iteration=0, collapse_streak=0, save=lambda: saved.append(trainer.iteration)
    )
    trainer.rollout_service = SimpleNamespace(stop_reason=None)
    healthy = {"actor/entropy": 0.8, "grad_norm": 0.4}
    flat = {"actor/entropy": 0.0, "grad_norm": 0.0}
    for metrics in (healthy, healthy, flat, healthy, flat, flat):  # a single flat iteration is forgiven
        trainer.iteration += 1
        PPOTrainer.after_iteration(trainer, metrics)
    assert saved == [1, 2, 4] and "iteration 6 not saved: the policy looks collapsed" in capsys.readouterr().out
    trainer.iteration += 1
    with pytest.raises(NonFiniteStop, match=r"the policy collapsed: .* in the last 3 iteration\(s\)"):
        PPOTrainer.after_iteration(trainer, flat)
    assert saved == [1, 2, 4]
    off = SimpleNamespace(
        rl=load_ppo_config("ppo_tiny_cpu", ["rl_config.max_collapsed_iterations=0"]).rl,
        cfg=cfg,
        iteration=0,
        collapse_streak=0,
        save=lambda: saved.append(-1),
        rollout_service=SimpleNamespace(stop_reason=None),
    )
    for _ in range(4):
        off.iteration += 1
        PPOTrainer.after_iteration(off, flat)
    assert saved[3:] == [-1] * 4


HEALTHY = {"actor/entropy": 0.8, "grad_norm": 0.4}
FLAT = {"actor/entropy": 0.0, "grad_norm": 0.0}
NOISE = {"actor/entropy": 3e-6, "grad_norm": 8.8e-15}  # the lr 0.5 run's collapsed iteration: rounding, not 0
SKIPPED = {"actor/entropy": 0.0, "grad_norm": float("nan")}  # a step skipped for a NaN loss


def test_the_collapse_guard_judges_with_tolerances():
    from mindspeed_rl.trainer.runtime.guards import collapsed

    assert collapsed(FLAT) is True and collapsed(NOISE) is True
    assert collapsed({"actor/entropy": 0.0, "grad_norm": 9e-9}) is True
    assert collapsed({"actor/entropy": 0.0, "grad_norm": 2e-8}) is False  # a gradient above the tolerance
    assert collapsed({"actor/entropy": 2e-4, "grad_norm": 0.0}) is False  # entropy left
    assert collapsed(HEALTHY) is False
    # cannot tell: a metric missing or not finite
    assert collapsed(SKIPPED) is None
    assert collapsed({"actor/entropy": float("nan"), "grad_norm": 0.0}) is None
    assert collapsed({"actor/entropy": 0.0, "grad_norm": float("inf")}) is None
    assert collapsed({"grad_norm": 0.0}) is None and collapsed({}) is None


def collapse_trainer(tmp_path, saved, *overrides):
    from types import SimpleNamespace

    cfg = load_ppo_config(
        "ppo_tiny_cpu",
        [
            "megatron_training.save_interval=1",
            f"actor_config.save={tmp_path}/actor",
            f"critic_config.save={tmp_path}/critic",
            f"rl_config.log_dir={tmp_path}/logs",
            *overrides,
        ],
    )
    trainer = SimpleNamespace(rl=cfg.rl, cfg=cfg, iteration=0, collapse_streak=0)
    trainer.save = lambda: saved.append(trainer.iteration)
    trainer.rollout_service = SimpleNamespace(stop_reason=None)
    return trainer


def test_rounding_noise_or_a_skipped_step_does_not_break_a_collapse_streak(tmp_path, capsys):
    """lr 0.5: the score is 0 from iteration 2 on; one iteration's gradient norm is 8.8e-15, another's NaN.
    Neither resets the streak, none of them is saved, and the guard stops the run."""
    from mindspeed_rl.trainer.ppo.ppo_trainer import PPOTrainer
    from mindspeed_rl.trainer.runtime.guards import NonFiniteStop

    saved = []
    trainer = collapse_trainer(tmp_path, saved, "rl_config.max_collapsed_iterations=4")
    for metrics in (HEALTHY, FLAT, NOISE, SKIPPED, FLAT):
        trainer.iteration += 1
        PPOTrainer.after_iteration(trainer, metrics)
    assert saved == [1] and trainer.collapse_streak == 3
    assert "iteration 4 not saved: the policy looks collapsed" in capsys.readouterr().out
    trainer.iteration += 1
    with pytest.raises(NonFiniteStop, match=r"in the last 4 iteration\(s\) \(this one: entropy 3e-06, gradient norm"):
        PPOTrainer.after_iteration(trainer, NOISE)
    assert saved == [1]
    # outside a streak a skipped step is the non-finite guard's to judge: saved as before
    saved = []
    trainer = collapse_trainer(tmp_path, saved)
    for metrics in (HEALTHY, SKIPPED, HEALTHY):
        trainer.iteration += 1
        PPOTrainer.after_iteration(trainer, metrics)
    assert saved == [1, 2, 3]


def test_a_run_whose_last_iterations_look_collapsed_does_not_exit_0(tmp_path, monkeypatch, capsys):
    """The last two of 4 iterations look collapsed (fewer than max_collapsed_iterations): they are not saved,
    so the run does not end as a success (exit 3, the last checkpoint and the resume overrides printed)."""
    from mindspeed_rl.trainer import launch
    from mindspeed_rl.trainer.ppo.ppo_trainer import PPOTrainer
    from mindspeed_rl.trainer.runtime.failures import EXIT_NONFINITE

    def runs(sequence):
        saved = []
        trainer = collapse_trainer(
            tmp_path, saved, "rl_config.max_collapsed_iterations=3", f"megatron_training.train_iters={len(sequence)}"
        )

        def train(cfg):  # fit()'s bookkeeping after each iteration
            for metrics in sequence:
                trainer.iteration += 1
                PPOTrainer.after_iteration(trainer, metrics)
            return list(sequence)

        monkeypatch.setattr(launch, "train", train)
        return launch.run(trainer.cfg), saved

    assert runs([HEALTHY, HEALTHY, FLAT, NOISE]) == (EXIT_NONFINITE, [1, 2])
    err = capsys.readouterr().err
    assert "stopped: iteration 4, the last, is not saved: the policy looks collapsed" in err
    assert runs([HEALTHY, FLAT, NOISE, HEALTHY]) == (0, [1, 4])
    assert runs([HEALTHY, HEALTHY, HEALTHY, SKIPPED]) == (0, [1, 2, 3, 4])


# ----- the converter -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("hf"))
    build_hf_model(folder, tiny_model_config(num_layers=2))
    return folder


def to_mg(load, save, *extra):
    return [
        "--load-model-type",
        "hf",
        "--save-model-type",
        "mg",
        "--load-dir",
        load,
        "--save-dir",
        save,
        "--add-qkv-bias",
        *extra,
    ]


@pytest.mark.parametrize("damage", ["truncated_safetensors", "malformed_config", "incomplete_config"])
def test_converter_names_the_broken_file(hf_dir, tmp_path, capsys, damage):
    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    if damage == "truncated_safetensors":
        weights = broken / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
        words = f"{weights}"
    elif damage == "malformed_config":
        (broken / "config.json").write_text('{"hidden_size": 64,')
        words = f"{broken / 'config.json'}: not valid JSON"
    else:
        config = json.loads((broken / "config.json").read_text())
        del config["hidden_size"]
        (broken / "config.json").write_text(json.dumps(config))
        words = f"{broken / 'config.json'}: lacks 'hidden_size'"
    err = user_error(capsys, convert_ckpt.main, to_mg(str(broken), str(tmp_path / "mg")))
    assert words in err


def test_converter_flags_and_folders(hf_dir, tmp_path, capsys):
    err = user_error(
        capsys,
        convert_ckpt.main,
        to_mg(hf_dir, str(tmp_path / "mg"), "--target-pipeline-parallel-size", "2", "--num-layer-list", "1,x"),
    )
    assert "--num-layer-list 1,x: expected comma-separated integers" in err
    assert convert_ckpt.main(to_mg(hf_dir, str(tmp_path / "lm"))) == 0
    shutil.copy(os.path.join(hf_dir, "config.json"), tmp_path / "config.json")
    err = user_error(
        capsys,
        convert_ckpt.main,
        [
            "--load-model-type",
            "mg",
            "--save-model-type",
            "hf",
            "--load-dir",
            str(tmp_path / "lm"),
            "--save-dir",
            str(tmp_path),
            "--orm",
        ],
    )
    assert "no value head" in err and not (tmp_path / "mg2hf").exists()
    training = tmp_path / "training"
    fake_checkpoint(str(training), tracker="200", iteration_dir="iter_0000200")
    err = user_error(capsys, convert_ckpt.main, to_mg(hf_dir, str(training)))
    assert "holds training checkpoints (latest iteration 200)" in err and "--force" in err
    assert ml.read_tracker(str(training)) == 200
    assert convert_ckpt.main(to_mg(hf_dir, str(training), "--force")) == 0
    assert ml.read_tracker(str(training)) == "release"


# ----- the preprocessor ----------------------------------------------------------------------------------------
def test_non_utf8_rows_are_counted_and_a_zero_row_rerun_loses_nothing(tmp_path, capsys):
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"It is {2 * i}. #### {2 * i}"} for i in range(6)]
    tok = str(tmp_path / "tok")
    build_tokenizer(tok, [r["question"] + r["answer"] for r in rows], vocab_size=300)
    data = tmp_path / "in.jsonl"
    lines = [json.dumps(r).encode() for r in rows]
    lines[2] = json.dumps({"question": "caf\u00e9 X", "answer": "#### 5"}).encode().replace(b"X", b"\xff\xfe")
    data.write_bytes(b"\n".join(lines) + b"\n")
    prefix = str(tmp_path / "out")
    common = [f"tokenizer_name_or_path={tok}", f"output_prefix={prefix}", "workers=1", "--quiet"]
    assert preprocess_data.main(["gsm8k", f"input={data}", *common]) == 0
    summary = json.loads(open(prefix + "_summary.json").read())
    assert summary["kept"] == 5 and summary["skipped"] == {"bad_encoding": 1}
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset

    labels = [PromptDataset(prefix)[i]["labels"] for i in range(5)]
    assert all("\ufffd" not in label for label in labels)
    before = {f: open(os.path.join(tmp_path, f), "rb").read() for f in os.listdir(tmp_path) if f.startswith("out")}
    (tmp_path / "empty.jsonl").write_text("{broken\n")
    err = user_error(capsys, preprocess_data.main, ["gsm8k", f"input={tmp_path / 'empty.jsonl'}", *common])
    assert "no row was kept" in err and "left as they were" in err
    after = {f: open(os.path.join(tmp_path, f), "rb").read() for f in os.listdir(tmp_path) if f.startswith("out")}
    assert after == before  # data and summary of the earlier run, untouched and consistent


# ----- signals and dead workers (end to end) ---------------------------------------------------------------------
# A training run started here carries this variable with a value of its own; Ray's processes inherit it from the
# driver, so a test counts and kills the processes of its own runs only (another stream of make test runs beside).
RUN_MARK = "MINDSPEED_RL_TEST_RUN"


def _read(pid, name):
    with open(f"/proc/{pid}/{name}", "rb") as fh:
        return fh.read()


def _parent_and_start(pid):
    fields = _read(pid, "stat").rsplit(b")", 1)[1].split()
    return fields[1].decode(), fields[19].decode()


def ray_processes(mark):
    """Ray's processes (daemons and workers) of the runs started with ``mark``, as (pid, start time): the ones
    carrying it, and their children (Ray's agents start without it)."""
    names = (b"raylet", b"gcs_server", b"ray::", b"dashboard", b"log_monitor")
    tag = f"{RUN_MARK}={mark}".encode()
    ray, marked = {}, set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(n in _read(pid, "cmdline") for n in names):
                ray[pid] = _parent_and_start(pid)
                if tag in _read(pid, "environ").split(b"\0"):
                    marked.add(pid)
        except OSError:  # gone meanwhile
            continue
    return {(pid, start) for pid, (parent, start) in ray.items() if pid in marked or parent in marked}


def orphaned_after(mark, seen, seconds=2.0):
    """The Ray processes of ``mark``'s runs, and those of ``seen`` (a census taken while they ran), still alive
    after ``seconds`` (looked at every 0.2 s, returning as soon as there are none)."""
    deadline = time.monotonic() + seconds
    while True:
        left = ray_processes(mark) | {(pid, start) for pid, start in seen if _alive(pid, start)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def _alive(pid, start):
    try:
        return _parent_and_start(pid)[1] == start
    except OSError:
        return False


def kill_workers(mark, name):
    """SIGKILL the Ray workers named ``name`` (``ray::CriticWorker``) of ``mark``'s runs."""
    for pid, _ in ray_processes(mark):
        if _read(pid, "cmdline").startswith(name.encode()):
            os.kill(int(pid), signal.SIGKILL)


def start_training(root, paths, *extra):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env[RUN_MARK] = str(root)
    cmd = [
        sys.executable,
        os.path.join(ROOT, "cli", "train_ppo.py"),
        # (no validation: these runs are about stopping, and it would only lengthen them)
        *train_args(root, paths, "megatron_training.save_interval=1", "rl_config.test_freq=0", *extra),
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_sigterm_stops_cleanly_and_a_dead_worker_restarts_the_run_which_ends_as_if_uninterrupted(assets, tmp_path):
    root, paths = assets
    proc = start_training(tmp_path / "term", paths, "megatron_training.train_iters=4")
    term_seen = wait_for(proc, "saved iteration 2")
    seen = ray_processes(tmp_path / "term")
    assert len(seen) >= 4  # raylet, gcs, the two workers at least: the census sees the run
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    term_out = "".join(term_seen) + out
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM" in out and "SIGTERM received" not in out and "Traceback (most recent" not in out
    saved = ml.read_tracker(str(tmp_path / "term" / "ckpt" / "actor"))
    assert isinstance(saved, int) and saved >= 2
    ml.load_rank(str(tmp_path / "term" / "ckpt" / "actor"), 0, 0)  # intact and loadable
    assert orphaned_after(tmp_path / "term", seen) == set()  # nothing orphaned

    # a dead worker with rl_config.max_restarts=1: the restart line is the one paragraph exit 4 would print
    # (who died, the last checkpoint, the resume overrides); the run resumes from the last checkpoint both
    # roles completed and takes iteration 2 exactly as the uninterrupted first run took it (exact resume)
    def metrics_of(out, iteration):
        run_dir = [
            line.split("run directory: ")[1].split()[0]
            for line in out.splitlines()
            if line.startswith("run directory: ")
        ][-1]
        with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
            return [m for m in map(json.loads, fh) if m["iteration"] == iteration][-1]

    proc = start_training(tmp_path / "dead", paths, "megatron_training.train_iters=3", "rl_config.max_restarts=1")
    lines = wait_for(proc, "saved iteration 1")
    seen = ray_processes(tmp_path / "dead")
    kill_workers(tmp_path / "dead", "ray::CriticWorker")
    out = "".join(lines) + proc.communicate(timeout=400)[0]
    assert proc.returncode == 0, out[-3000:]
    message = [line for line in out.splitlines() if line.startswith("restart 1 of 1 (rl_config.max_restarts): ")]
    assert len(message) == 1 and "the critic worker of rank 0 died" in message[0], out[-3000:]
    assert (
        f"Resume by adding: actor_config.finetune=false actor_config.load={tmp_path}/dead/ckpt/actor "
        "actor_config.no_load_optim=false actor_config.no_load_rng=false critic_config.finetune=false "
        f"critic_config.load={tmp_path}/dead/ckpt/critic critic_config.no_load_optim=false"
    ) in message[0]
    assert "ActorDiedError" not in out and "resumed at iteration" in out
    assert metrics_of(out, 3)["iteration"] == 3  # the restarted run went to the end
    a, b = metrics_of(term_out, 2), metrics_of(out, 2)
    for key in ("critic/score/mean", "actor/pg_loss", "critic/vf_loss", "grad_norm", "response_length/mean"):
        assert a[key] == pytest.approx(b[key], abs=1e-6), key
    assert orphaned_after(tmp_path / "dead", seen) == set()


def test_a_dead_worker_without_restarts_left_stops_with_exit_4_and_one_paragraph(monkeypatch, capsys):
    from mindspeed_rl.trainer import launch
    from mindspeed_rl.trainer.runtime.failures import EXIT_WORKER_DIED, WorkerDied

    cfg = load_ppo_config("ppo_tiny_cpu", ["rl_config.max_restarts=0"])
    calls = []

    def dies(cfg):
        calls.append(cfg)
        raise WorkerDied("the critic worker of rank 0 died (killed). No checkpoint was saved yet")

    monkeypatch.setattr(launch, "train", dies)
    assert launch.run(cfg) == EXIT_WORKER_DIED and len(calls) == 1
    err = capsys.readouterr().err
    assert err.strip() == "stopped: the critic worker of rank 0 died (killed). No checkpoint was saved yet"
    # with restarts left but nothing saved yet, the run begins again, then stops when they are used up
    import ray

    monkeypatch.setattr(ray, "shutdown", lambda: None)
    assert launch.run(load_ppo_config("ppo_tiny_cpu", ["rl_config.max_restarts=2"])) == EXIT_WORKER_DIED
    assert len(calls) == 4 and capsys.readouterr().out.count("restart ") == 2


# ----- resume pairs roles only at an iteration every role completed; one run per folder ---------------------------
def test_a_save_stopped_between_the_roles_resumes_both_from_the_last_common_iteration(tmp_path, capsys):
    """The driver was killed after the actor committed iteration 2 and before the critic did."""
    from mindspeed_rl.trainer.startup.preflight import resume_iteration

    for role, done in (("actor", (1, 2)), ("critic", (1,))):
        for it in done:
            ml.begin_save(str(tmp_path / role), it)
            ml.write_rank(
                str(tmp_path / role), it, 0, 0, 1, {"model": {"w": torch.full((2,), float(it))}, "iteration": it}
            )
            ml.commit_save(str(tmp_path / role), it, 1)
    ml.write_rank(str(tmp_path / "critic"), 2, 0, 0, 1, {"model": {}, "iteration": 2})  # its staging folder
    cfg = load_ppo_config(
        "ppo_tiny_cpu",
        [
            f"actor_config.load={tmp_path}/actor",
            "actor_config.finetune=false",
            f"critic_config.load={tmp_path}/critic",
            "critic_config.finetune=false",
        ],
    )
    assert resume_iteration(cfg) == 1
    out = capsys.readouterr().out
    assert "(actor 2, critic 1: the last save was interrupted); resuming every role from iteration 1" in out
    assert ml.load_rank(str(tmp_path / "actor"), 0, 0, iteration=1)["model"]["w"].tolist() == [1.0, 1.0]
    # roles that agree resume at their tracker, silently
    ml.begin_save(str(tmp_path / "critic"), 2)
    ml.write_rank(str(tmp_path / "critic"), 2, 0, 0, 1, {"model": {}, "iteration": 2})
    ml.commit_save(str(tmp_path / "critic"), 2, 1)
    assert resume_iteration(cfg) == 2 and capsys.readouterr().out == ""


def test_the_resume_hint_names_every_role_its_optimizer_and_rng_and_quotes_paths(tmp_path):
    from mindspeed_rl.trainer.runtime.failures import last_checkpoint_text

    save = tmp_path / "my runs" / "actor"
    fake_checkpoint(str(save), tracker="3", iteration_dir="iter_0000003")
    cfg = load_ppo_config("ppo_tiny_cpu", [f"actor_config.save={save}", f"critic_config.save={tmp_path}/critic"])
    text = last_checkpoint_text(cfg)
    hint = text.split("Resume by adding: ")[1]
    assert f"'actor_config.load={save}'" in hint and "(iteration 3)" in text
    parsed = dict(item.split("=", 1) for item in __import__("shlex").split(hint))
    assert parsed == {
        "actor_config.finetune": "false",
        "actor_config.load": str(save),
        "actor_config.no_load_optim": "false",
        "actor_config.no_load_rng": "false",
        "critic_config.finetune": "false",
        "critic_config.load": f"{tmp_path}/critic",
        "critic_config.no_load_optim": "false",
        "critic_config.no_load_rng": "false",
    }


def test_a_folder_lock_is_refused_while_its_run_lives_and_taken_over_when_it_is_gone(tmp_path):
    import socket

    from mindspeed_rl.utils.run_lock import LOCK_NAME, FolderLocked, RunLock

    folders = [("actor_config.save", str(tmp_path / "ckpt")), ("rl_config.log_dir", str(tmp_path / "logs"))]
    with RunLock(folders):
        assert sorted(os.listdir(tmp_path / "ckpt")) == [LOCK_NAME]
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:  # the same folder from a second live run (another pid)
            (tmp_path / "logs" / LOCK_NAME).write_text(
                json.dumps({"pid": holder.pid, "host": socket.gethostname(), "started": time.time()})
            )
            with pytest.raises(
                FolderLocked, match=f"rl_config.log_dir: {tmp_path}/logs is used by a live run \\(pid {holder.pid} on"
            ):
                RunLock([("rl_config.log_dir", str(tmp_path / "logs"))]).acquire()
        finally:
            holder.kill()
            holder.wait()
        # that run is gone: its lock is stale and taken over, with a note
        second = RunLock([("rl_config.log_dir", str(tmp_path / "logs"))]).acquire()
        assert "took over the stale lock" in second.notes[0] and str(holder.pid) in second.notes[0]
        second.release()
        (tmp_path / "logs" / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": 0}))
        with pytest.raises(FolderLocked, match="used by a run on another host .*if that run is gone, delete"):
            RunLock([("rl_config.log_dir", str(tmp_path / "logs"))]).acquire()
        assert os.path.exists(tmp_path / "ckpt" / LOCK_NAME)  # a refused run leaves the holder's locks alone
    assert not os.path.exists(tmp_path / "ckpt" / LOCK_NAME)  # released at the end


def test_a_full_disk_during_a_save_says_so_removes_its_staging_files_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch
):
    import collections

    ckpt = str(tmp_path / "ckpt")
    ml.begin_save(ckpt, 1)
    ml.write_rank(ckpt, 1, 0, 0, 1, {"model": {"w": torch.ones(2)}, "iteration": 1})
    ml.commit_save(ckpt, 1, 1)

    def full(payload, path):  # what torch's stream writer raises when the disk fills up
        open(path, "wb").write(b"half")
        raise RuntimeError(
            "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
            "data/0: file write failed"
        )

    monkeypatch.setattr(ml.torch, "save", full)
    monkeypatch.setattr(ml.shutil, "disk_usage", lambda folder: collections.namedtuple("U", "total used free")(1, 1, 0))
    ml.begin_save(ckpt, 2)
    with pytest.raises(ml.CheckpointError) as caught:
        ml.write_rank(ckpt, 2, 0, 0, 1, {"model": {"w": torch.zeros(2)}, "iteration": 2})
    assert str(caught.value) == (
        f"no space left on {ckpt} while saving iter_0000002: its staging files are removed "
        "and iter_0000001 stays the latest checkpoint; free space and resume"
    )
    assert sorted(os.listdir(ckpt)) == ["iter_0000001", ml.TRACKER]
    monkeypatch.undo()
    assert ml.load_rank(ckpt, 0, 0)["model"]["w"].tolist() == [1.0, 1.0]
    # another write failure with space left is not called a full disk
    monkeypatch.setattr(ml.torch, "save", full)
    with pytest.raises(RuntimeError, match="file write failed"):
        ml.write_rank(ckpt, 3, 0, 0, 1, {"model": {}, "iteration": 3})


def test_a_worker_exception_arrives_as_its_type_and_message(tmp_path):
    import ray.exceptions

    from mindspeed_rl.trainer.runtime.failures import describe_dead_worker, describe_worker_error, exception_line

    cfg = load_ppo_config("ppo_tiny_cpu", [f"actor_config.save={tmp_path}/actor"])
    error = ml.CheckpointError(f"no space left on {tmp_path}/actor while saving iter_0000002")
    raised = ray.exceptions.RayTaskError(
        "save",
        "Traceback (most recent call last):\n  ...\nCheckpointError: no space",
        error,
        "ray::actor_0_17:IntegratedActorWorker.save",
    ).as_instanceof_cause()
    out = describe_worker_error(raised, [], cfg, str(tmp_path / "run"))
    assert out.user_error and str(out).startswith(
        f"the actor worker of rank 0 raised CheckpointError: no space left on {tmp_path}/actor while saving"
    )
    assert "CheckpointError: no space" in (tmp_path / "run" / "worker_error.txt").read_text()  # the whole traceback
    bug = ray.exceptions.RayTaskError("update", "tb", KeyError("x"), "ray::critic_1_3:CriticWorker.update")
    assert not describe_worker_error(bug.as_instanceof_cause(), [], cfg, str(tmp_path / "run")).user_error
    # a constructor that raised: the dead-worker paragraph shows the exception, not only "died"
    text = (
        "The actor died because of an error raised in its creation task, ray::actor_0_5:IntegratedActorWorker"
        '.__init__() (pid=1, ip=1)\nTraceback (most recent call last):\n  File "x.py", line 1\n'
        "ValueError: User-specified max_model_len (4096) is greater than the derived max_model_len (1024)"
    )
    assert exception_line(text).startswith("ValueError: User-specified max_model_len (4096)")
    assert "the actor worker of rank 0 died (ValueError: User-specified" in describe_dead_worker(
        type("E", (), {"__str__": lambda self: text})(), [], cfg
    )


def test_sigterm_during_worker_start_up_exits_143_with_a_message_within_30_s(assets, tmp_path):
    root, paths = assets
    proc = start_training(tmp_path / "early", paths)
    wait_for(proc, "placement group:")  # Ray is up; the workers start (vLLM, megatron, weights)
    time.sleep(1)
    seen = ray_processes(tmp_path / "early")
    proc.send_signal(signal.SIGTERM)
    sent = time.perf_counter()
    out = proc.communicate(timeout=120)[0]
    # well inside an orchestrator's usual 30 s grace before SIGKILL: 8 s here (a shutdown queued behind the workers'
    # start-up took 22.7 s on this machine, 64 s on a loaded one)
    assert time.perf_counter() - sent < 15, out[-3000:]
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM" in out and "Traceback (most recent" not in out
    assert orphaned_after(tmp_path / "early", seen) == set()


def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on():
    """A run that seems hung says where it waits: SIGUSR1 to any of our commands prints its threads' Python stacks
    on stderr, and the command carries on."""
    code = (
        "import time\n"
        "from mindspeed_rl.utils.cli import report_user_errors\n"
        "@report_user_errors\n"
        "def waits_here(argv=None):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(3)\n"
        "    print('went on', flush=True)\n"
        "    return 0\n"
        "raise SystemExit(waits_here())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert "ready" in proc.stdout.readline()
    proc.send_signal(signal.SIGUSR1)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert "most recent call first" in out and "in waits_here" in out and "went on" in out, out


def test_sigterm_maps_to_143_whatever_ray_makes_of_the_interrupt(tmp_path, monkeypatch, capsys):
    """Ray's blocking calls (ray.get, ray.wait) turn the Terminated our handler raises into a plain
    KeyboardInterrupt, and ray.init's own handler calls sys.exit(15): both still end as SIGTERM (143)."""
    import ray

    from mindspeed_rl.trainer import launch
    from mindspeed_rl.trainer.runtime import ray_run
    from mindspeed_rl.utils.cli import Terminated, raise_terminated, report_user_errors, stop_on_sigterm

    def like_ray_get():
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None

    def terminated(argv):
        with stop_on_sigterm():
            like_ray_get()

    def ctrl_c(argv):
        with stop_on_sigterm():
            raise KeyboardInterrupt()

    before = signal.getsignal(signal.SIGTERM)
    assert report_user_errors(terminated)(None) == 143 and "stopped by SIGTERM" in capsys.readouterr().err
    assert report_user_errors(ctrl_c)(None) == 130 and "interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
    # the driver's own mapping: its message and 143; a Ctrl-C goes on to the CLI's 130
    cfg = load_ppo_config(
        "ppo_tiny_cpu",
        [f"actor_config.save={tmp_path}/a", f"critic_config.save={tmp_path}/c", f"rl_config.log_dir={tmp_path}/l"],
    )
    monkeypatch.setattr(launch, "train", lambda cfg: like_ray_get())
    assert launch.run(cfg) == 143 and "stopped by SIGTERM: workers shut down" in capsys.readouterr().err
    monkeypatch.setattr(launch, "train", lambda cfg: ctrl_c(None))
    with pytest.raises(KeyboardInterrupt):
        launch.run(cfg)

    # SIGTERM while ray.init runs its own handler (sys.exit(15))
    def init(**kwargs):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with stop_on_sigterm():
        with pytest.raises(Terminated):
            ray_run.init_ray({})
        assert signal.getsignal(signal.SIGTERM) is raise_terminated


def test_a_sigterm_dropped_in_a_del_is_raised_again_at_the_next_check(capsys):
    """Python runs the handler inside whatever the main thread does, a ``__del__`` of garbage collection
    included, and drops the exception raised there: the run's next check raises it, and no "Exception
    ignored" traceback reaches the console. Outside a stop_on_sigterm block a check does nothing."""
    from mindspeed_rl.utils.cli import Terminated, raise_if_terminated, stop_on_sigterm

    class Collected:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)

    with stop_on_sigterm():
        raise_if_terminated()  # nothing received yet
        Collected()  # the handler runs in its __del__
        with pytest.raises(Terminated):
            raise_if_terminated()
    assert "Exception ignored" not in capsys.readouterr().err
    raise_if_terminated()  # the block is over: the SIGTERM was its own


def test_a_sigterm_that_ray_init_would_swallow_still_stops_the_run(monkeypatch):
    """ray.init puts its own SIGTERM handler (sys.exit) in place while it runs; a SystemExit raised where Python drops
    it (a lock release, a __del__) left the process running. init_ray keeps the process's handler instead, and the
    signal raises once ray.init returns."""
    import ray
    from ray._private import utils as ray_utils

    from mindspeed_rl.trainer.runtime.ray_run import init_ray
    from mindspeed_rl.utils.cli import Terminated, stop_on_sigterm

    def init(**kwargs):
        ray_utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # as ray.init does first
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the handler runs here
        except BaseException:  # noqa: BLE001 - what Python does with an exception raised in a __del__
            pass

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with stop_on_sigterm():
        with pytest.raises(Terminated):
            init_ray({})


SIGTERM_STAGES = """
import sys, time
from mindspeed_rl.utils.cli import report_user_errors, stop_on_sigterm

def nap():
    time.sleep(120)

@report_user_errors
def main(argv):
    import ray
    from mindspeed_rl.accelerator.cpu import CpuAccelerator
    from mindspeed_rl.trainer.runtime.ray_run import init_ray
    from mindspeed_rl.workers.launcher import create_placement_group

    with stop_on_sigterm():
        try:
            print("stage: ray.init", flush=True)
            init_ray({})
            create_placement_group(CpuAccelerator(), 1, 1.0, "test")
            print("stage: placement group created", flush=True)
            ray.get(ray.remote(num_cpus=0)(nap).remote())
        finally:
            ray.shutdown()
    return 0

sys.exit(main(None))
"""


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["stage: ray.init", "stage: placement group created"])
def test_sigterm_while_ray_starts_or_just_after_the_placement_group_exits_143(stage):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_STAGES], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    wait_for(proc, stage, timeout=120)
    time.sleep(1)  # ray.init takes seconds; the placement group's ray.get waits 120 s
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM" in out and "Traceback (most recent" not in out


# ----- placement: more devices than the Ray cluster has --------------------------------------------------------
def test_a_placement_larger_than_the_cluster_is_refused_naming_the_keys():
    from mindspeed_rl.workers.launcher import bundles_that_fit, placement_shortfall

    two_cpus = [{"CPU": 2.0, "memory": 1e9}]
    assert placement_shortfall("rl_config.actor_resource.num_npus 64", {"CPU": 0.5}, 64, two_cpus) == (
        "rl_config.actor_resource.num_npus 64: the run needs 64 placement-group bundle(s) of CPU 0.5 (CPU 32 in "
        "all), but the Ray cluster has CPU 2 on 1 node(s): room for 4 such bundle(s). Ask for fewer, or give Ray "
        "more devices (NPUS_PER_NODE, NNODES in docs/operations.md)"
    )
    assert placement_shortfall("k", {"CPU": 0.5}, 4, two_cpus) is None
    npu_nodes = [{"NPU": 16.0, "CPU": 192.0}] * 2
    assert placement_shortfall("k", {"NPU": 1.0, "CPU": 1.0}, 32, npu_nodes) is None
    assert "CPU 33, NPU 33 in all" in placement_shortfall("k", {"NPU": 1.0, "CPU": 1.0}, 33, npu_nodes)
    # a bundle lies on one node: two nodes of 3 CPUs hold two bundles of 2, though they have 6 CPUs
    assert "room for 2" in placement_shortfall("k", {"CPU": 2.0}, 3, [{"CPU": 3.0}] * 2)
    assert bundles_that_fit({"CPU": 0.1}, [{"CPU": 0.7}]) == 7  # 0.7 / 0.1 is 6.999... in floats
    assert bundles_that_fit({"NPU": 1.0, "CPU": 1.0}, [{"CPU": 8.0}]) == 0  # no device on that node


@pytest.mark.slow
def test_a_2_cpu_ray_refuses_64_slots_in_seconds_and_waits_for_slots_other_jobs_hold(capsys, monkeypatch):
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    from mindspeed_rl.accelerator.cpu import CpuAccelerator
    from mindspeed_rl.utils.cli import UserError
    from mindspeed_rl.workers.launcher import create_placement_group

    acc = CpuAccelerator()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        start = time.perf_counter()
        with pytest.raises(UserError, match=r"^rl_config.actor_resource.num_npus 64: .* room for 4 such bundle"):
            create_placement_group(acc, 64, 0.5, "rl_config.actor_resource.num_npus 64")
        assert time.perf_counter() - start < 5
        holder = placement_group([{"CPU": 2.0}])  # another job's
        ray.get(holder.ready())
        with pytest.raises(UserError, match="fit the Ray cluster but were not free within 2s"):
            create_placement_group(acc, 1, 1.0, "k", timeout=2, report_every=0.5)
        assert "waiting for Ray to place 1 bundle(s) of CPU 1: " in capsys.readouterr().out
        assert [pg["state"] for pg in placement_group_table().values()].count("PENDING") == 0  # given back
        remove_placement_group(holder)
        pg = create_placement_group(acc, 2, 1.0, "k", timeout=30)
        assert placement_group_table(pg)["state"] == "CREATED"
        # a bundle on the driver's own node: its master address is looked up here, without a task
        from mindspeed_rl.workers import launcher

        looked_up = []
        real = launcher._node_ip_and_ports
        monkeypatch.setattr(launcher, "_node_ip_and_ports", lambda *a: looked_up.append(a) or real(*a))
        addr, ports = launcher.bundle_ip_and_ports(pg, 1, 2, avoid=[1])
        assert looked_up == [(2, [1])] and addr == ray.util.get_node_ip_address() and len(set(ports)) == 2
    finally:
        ray.shutdown()


def test_a_port_handed_to_a_group_still_starting_is_not_handed_out_again(monkeypatch):
    """Groups start side by side: one group's master port is not bound yet when the next group asks."""
    import ray

    from mindspeed_rl.utils import dist
    from mindspeed_rl.workers.launcher import _node_ip_and_ports

    offered = iter([20001, 20001, 20002, 20003])
    monkeypatch.setattr(dist, "free_port", lambda host="127.0.0.1": next(offered))
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.1")
    assert _node_ip_and_ports(2, avoid={20002}) == ("10.0.0.1", [20001, 20003])


def test_a_restart_resumes_every_role_from_its_save_or_none(tmp_path):
    from mindspeed_rl.trainer.runtime.failures import resumed_config

    cfg = load_ppo_config(
        "ppo_tiny_cpu",
        [f"actor_config.save={tmp_path}/actor", f"critic_config.save={tmp_path}/critic", "rl_config.max_restarts=2"],
    )
    assert resumed_config(cfg) is cfg  # nothing saved yet: the restart begins again
    fake_checkpoint(str(tmp_path / "actor"), tracker="1", iteration_dir="iter_0000001")
    assert resumed_config(cfg) is None  # the actor saved, the critic not: no restart pairs them
    fake_checkpoint(str(tmp_path / "critic"), tracker="1", iteration_dir="iter_0000001")
    resumed = resumed_config(cfg)
    for role in (resumed.actor, resumed.critic):
        m = role.megatron
        assert (m.finetune, m.load, m.no_load_optim, m.no_load_rng) == (False, m.save, False, False)
    assert resumed.rl.max_restarts == 2 and resumed.actor.model == cfg.actor.model


def test_a_tokenizer_with_remote_code_is_refused_without_a_prompt_or_running_it(tmp_path):
    from mindspeed_rl.utils.cli import UserError
    from mindspeed_rl.utils.hf_tokenizer import load_tokenizer

    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tok.MyTok", None]}, "tokenizer_class": "MyTok"})
    )
    (tmp_path / "tok.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    with pytest.raises(UserError, match="needs its own Python code .* which is never run here"):
        load_tokenizer(str(tmp_path), "megatron_training.tokenizer_name_or_path")
    assert not (tmp_path / "ran").exists()
