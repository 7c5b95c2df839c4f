"""From a validated config to a running PPO job: Ray, placement, workers, data, the trainer. What happens when
the job fails (exit codes, dead workers, restarts) is ``failures.py``."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Dict, List, Tuple

from ..config_cls.ppo_config import PPOConfig
from ..features.evaluation import eval_devices
from ..features.validation import validates
from ..utils.cli import UserError, raise_if_terminated, stop_on_sigterm
from ..utils.hf_tokenizer import load_tokenizer
from ..workers.launcher import RunFrame
from .runtime.failures import train_to_exit_code
from .runtime.ray_run import new_run_dir, ray_run


def run(cfg: PPOConfig) -> int:
    """Train; returns the process exit code (docs/operations.md, "When things go wrong")."""
    with stop_on_sigterm():
        return train_to_exit_code(cfg, train)


def open_prompts(cfg: PPOConfig):
    """(training prompts, test prompts or None), each a memory-mapped PromptDataset."""
    from ..datasets.prompt_dataset import DatasetMissing, PromptDataset

    m = cfg.actor.megatron

    def one(key: str):
        try:
            return PromptDataset(getattr(m, key), m.dataset_additional_keys, cfg.rl.max_prompt_length, key=key)
        except DatasetMissing as exc:
            raise UserError(str(exc)) from None

    return one("data_path"), one("test_data_path") if m.test_data_path and validates(cfg) else None


@dataclasses.dataclass
class Roles:
    """The worker groups of a run and the rollout service in front of the generating ones."""

    actor: Any
    service: Any
    critic: Any = None
    reward: Any = None
    teacher: Any = None
    judge: Any = None  # the judge's own engines (judge_config.serve engines)
    evaluator: Any = None  # evaluation's own engine (eval_config.engines own)
    rollout: List[Any] = dataclasses.field(default_factory=list)  # the rollout workers' engines, a group each


def start_roles(cfg: PPOConfig, frame: RunFrame, tokenizer, run_dir: str) -> Roles:
    """Every role's worker group on the run's placement group (appended to ``frame.workers`` as each starts); side
    by side where the accelerator allows it (``roles_start_together``), else one after another. Bundles: the
    actor's (shared by the colocated roles), then the rollout workers', a teacher's and a judge's of their own."""
    from ..workers.actor_worker import IntegratedActorWorker
    from ..workers.critic_worker import CriticWorker
    from ..workers.launcher import spawn_group, wait_until_built
    from ..workers.reward_worker import RewardWorker
    from ..workers.rollout_worker import RolloutWorker
    from ..workers.teacher_worker import TeacherWorker

    rl, gen, acc = cfg.rl, cfg.generate, frame.acc
    devices, rollout_devices = cfg.actor.num_devices, cfg.rollout_devices
    cpus_per_bundle, threads = acc.bundle_cpus(cfg.world_size + eval_devices(cfg))
    whole = acc.bundle_spec(cpus_per_bundle)[acc.ray_resource]
    shared = whole / len(cfg.colocated_roles)  # the roles share each bundle's device slot (CPU: its CPUs)
    steps = cfg.megatron_training.train_iters * (cfg.samples_per_iteration // rl.mini_batch_size) * rl.epochs
    ports: set = set()  # master ports of the groups still starting

    def spawn(name, cls, num_ranks, share, first_bundle=0, concurrency=1, **kwargs):
        """One group of ranks; each rank gets its place in the group's torch.distributed world."""
        wait = not acc.roles_start_together
        return spawn_group(frame, name, cls, num_ranks, share, threads, kwargs, first_bundle, wait, ports, concurrency)

    ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id or 0)
    actor = dict(role=cfg.actor, rl=rl, gen=gen, total_steps=steps, with_engine=not rollout_devices, **ids)
    roles = Roles(spawn("actor", IntegratedActorWorker, devices, shared, **actor), service=None)
    respawn = None
    if rollout_devices:  # disaggregated layout: the rollout workers' bundles follow the actor's, an engine a group
        engines = dict(model=cfg.actor.model, gen=gen, bf16=cfg.actor.megatron.bf16, **ids)
        engines["capture_routes"] = cfg.captures_routes
        engines["processor_dir"] = cfg.actor.megatron.tokenizer_name_or_path
        engines["in_flight"] = in_flight = rl.async_training.in_flight_weight_updates
        # in-flight updates: the pause, the weights and the resume arrive while a generation runs (threads)
        concurrency = 4 if in_flight else 1
        size = gen.infer_tensor_parallel_size

        def respawn(engine: int, incarnation: int = 0, wait: bool = False):
            kwargs = dict(engines, engine_offset=engine, incarnation=incarnation)
            first = devices + engine * size
            return spawn_group(
                frame, f"rollout{engine}", RolloutWorker, size, whole, threads, kwargs, first, wait, ports, concurrency
            )

        roles.rollout = [
            respawn(engine, wait=not acc.roles_start_together) for engine in range(rollout_devices // size)
        ]
    if cfg.uses_critic:
        critic = dict(role=cfg.critic, rl=rl, total_steps=steps, offload_when_idle=acc.offload_when_idle)
        roles.critic = spawn("critic", CriticWorker, cfg.critic.num_devices, shared, **critic)
    if cfg.reward is not None:
        roles.reward = spawn("reward", RewardWorker, cfg.reward.num_devices, shared, role=cfg.reward, rl=rl)
    if cfg.teacher is not None:  # colocated: offloaded when idle where the device offloads; else after the others
        colocated = rl.teacher_colocate
        teacher = dict(role=cfg.teacher, rl=rl, offload_when_idle=colocated and acc.offload_when_idle)
        first = 0 if colocated else devices + rollout_devices
        share = shared if colocated else whole
        roles.teacher = spawn("teacher", TeacherWorker, cfg.teacher.num_devices, share, first, **teacher)
    if cfg.judge_devices:  # the judge's engines on the last bundles
        from ..workers.judge_worker import JudgeWorker
        from .ppo.judging import judge_hf_folder

        first = devices + rollout_devices + cfg.teacher_devices
        judge = dict(judge=cfg.judge, hf_dir=judge_hf_folder(cfg, run_dir))
        roles.judge = spawn("judge", JudgeWorker, cfg.judge_devices, whole, first_bundle=first, **judge)
    if eval_devices(cfg):  # evaluation's engine on the very last bundles (outside the throughput's world_size)
        from ..workers.eval_worker import EvalWorker
        from .ppo.evaluation import eval_worker_args

        roles.evaluator = spawn("eval", EvalWorker, eval_devices(cfg), whole, cfg.world_size, **eval_worker_args(cfg))
    wait_until_built([group for group in frame.workers if group not in roles.rollout])
    faults = rl.rollout_fault_tolerance
    wait_until_built(roles.rollout, faults.setup_timeout_s, "rl_config.rollout_fault_tolerance.setup_timeout_s")
    roles.service = rollout_service(cfg, frame, roles, respawn)
    return roles


def rollout_service(cfg: PPOConfig, frame: RunFrame, roles: Roles, respawn=None):
    """What generates: the actor's own engines, or the fleet of rollout workers, each engine behind a weight
    channel of its own."""
    from ..rollout.service import ColocatedRollout, DisaggregatedRollout, InFlightUpdates
    from ..workers.launcher import weight_channel_opener, weight_transfer_of
    from ..workers.rollout_fleet import FaultLimits, RolloutFleet

    limits = FaultLimits.of(cfg.rl.rollout_fault_tolerance)
    if not roles.rollout:
        print(f"rollout engines: {roles.actor.describe_engines()}", flush=True)
        return ColocatedRollout(roles.actor, limits.generate_timeout_s)
    transfer = weight_transfer_of(roles.rollout)
    connect = weight_channel_opener(
        frame.pg, transfer, limits.weight_sync_timeout_s, limits.setup_timeout_s, len(roles.rollout)
    )
    vocab = cfg.actor.model.padded_vocab_size or 2**31 - 1
    max_tokens = cfg.generate.sampling_config.max_tokens
    fleet = RolloutFleet(roles.rollout, limits, vocab, max_tokens, respawn if limits.enabled else None, connect)
    for engine in fleet.engines:
        connect(roles.actor, engine)
    print(f"rollout workers (disaggregated): {fleet.describe()}; weights over {transfer}", flush=True)
    in_flight = InFlightUpdates.of(cfg.rl.async_training)
    return DisaggregatedRollout(roles.actor, fleet, in_flight)


def load_models(cfg: PPOConfig, roles: Roles, resume_at) -> Tuple[int, Dict]:
    """Weights (and on a resume optimizer, RNG) into every role; returns (first iteration, trainer state)."""
    am, cm, rl = cfg.actor.megatron, cfg.critic.megatron, cfg.rl
    if roles.reward is not None:
        roles.reward.call("init_weights", cfg.reward.megatron.load)
    if roles.teacher is not None:
        roles.teacher.call("init_weights", cfg.teacher.megatron.load)
    actor_load, critic_load = am.load or None, cm.load or None
    resumed = roles.actor.call(
        "init_weights",
        actor_load,
        am.finetune,
        not am.no_load_optim,
        not am.no_load_rng,
        rl.integrated_mode_config.ref_model_load_path,
        resume_at,
    )[0]
    if roles.critic is not None:
        roles.critic.call("init_weights", critic_load, cm.finetune, not cm.no_load_optim, not cm.no_load_rng, resume_at)
    return (resumed.iteration if not am.finetune and actor_load else 0), resumed.trainer_state


def placement_keys(cfg: PPOConfig) -> str:
    """The keys that size the placement group, with their values (the other roles share the actor's bundles)."""
    keys = f"rl_config.actor_resource.num_npus {cfg.actor.num_devices}"
    if cfg.rollout_devices:
        keys += f" + rl_config.rollout_resource.num_npus {cfg.rollout_devices}"
    if cfg.teacher_devices:
        keys += f" + rl_config.teacher_resource.num_npus {cfg.teacher_devices} (teacher_colocate false)"
    if cfg.judge_devices:
        keys += f" + rl_config.judge_resource.num_npus {cfg.judge_devices}"
    if eval_devices(cfg):
        keys += f" + eval_config.num_devices {eval_devices(cfg)} (engines own)"
    return keys


def train(cfg: PPOConfig) -> List[Dict[str, float]]:
    from ..config_cls.ppo_config import to_plain
    from .report.report import write_run_info
    from .startup.plan import batch_plan
    from .startup.precision import settle_run_precision
    from .startup.preflight import preflight

    settle_run_precision(cfg)  # settled by the entry point already; a config built in code settles here
    tokenizer = load_tokenizer(cfg.actor.megatron.tokenizer_name_or_path, "megatron_training.tokenizer_name_or_path")
    dataset, test_dataset = open_prompts(cfg)
    run_dir, log_dir = new_run_dir(cfg.rl)
    libraries = ", logs/ of vLLM, Ray and megatron" if log_dir else ""
    print(f"run directory: {run_dir} (metrics.jsonl, curves, report.html{libraries})", flush=True)
    tests = f"; test prompts: {len(test_dataset)} from {cfg.actor.megatron.test_data_path}" if test_dataset else ""
    print(
        f"prompts: {len(dataset)} from {cfg.actor.megatron.data_path} ({dataset.dropped} over max_prompt_length)"
        f"{tests}",
        flush=True,
    )
    resolved = {k: v for k, v in to_plain(cfg).items() if k != "raw"}
    write_run_info(run_dir, cfg.raw, resolved, batch_plan(cfg), sys.argv)
    started = time.perf_counter()
    resume_at = preflight(cfg)
    raise_if_terminated()  # (a SIGTERM whose exception a __del__ dropped: here, between phases, and each iteration)
    # the placement group: the actor's devices, then the rollout workers', a teacher's and a judge's of their own
    with ray_run(cfg, run_dir, log_dir, cfg.world_size + eval_devices(cfg), placement_keys(cfg)) as frame:
        roles = start_roles(cfg, frame, tokenizer, run_dir)
        start, state = load_models(cfg, roles, resume_at)
        raise_if_terminated()
        trainer = build_trainer(cfg, frame, roles, tokenizer, (dataset, test_dataset), run_dir, resolved, start)
        trainer.load_trainer_state(state)
        print(
            f"workers ready in {time.perf_counter() - started:.1f}s (Ray, placement, models, rollout engines, "
            "checkpoints)",
            flush=True,
        )
        if start:
            print(
                f"resumed at iteration {start} from {cfg.actor.megatron.load} (consumed samples "
                f"{trainer.sampler.consumed_samples})",
                flush=True,
            )
        history = trainer.fit()
    if log_dir:
        from ..utils.library_logs import summary_line

        line = summary_line(log_dir)
        if line:
            print(line, flush=True)
    print(f"run directory: {run_dir}", flush=True)
    return history


def build_trainer(cfg: PPOConfig, frame: RunFrame, roles: Roles, tokenizer, datasets, run_dir: str, resolved, start):
    """The trainer over the started roles: its prompt sampler, rule-reward runner, metrics logger and judge, each
    closed with the run (``frame.on_exit``)."""
    from ..datasets.prompt_dataset import PromptSampler
    from ..rewards.runner import RuleRewardRunner
    from .ppo.batches import build_batches
    from .ppo.ppo_trainer import PPOTrainer
    from .report.loggers import MetricsLogger

    mt, rl = cfg.megatron_training, cfg.rl
    dataset, test_dataset = datasets
    sampler = PromptSampler(len(dataset), mt.global_batch_size, mt.seed, shuffle=not mt.no_shuffle)
    runner = None
    if rl.rule_reward:
        runner = RuleRewardRunner(
            rl.verifier_function,
            rl.verifier_weight,
            rl.verifier_timeout,
            workers=max(1, int(rl.num_cpus_for_local_task)),
        )
        frame.on_exit(runner.close)
    logger = MetricsLogger(
        run_dir, mt.train_iters, rl, {"rl_config": resolved["rl"], "actor": resolved["actor"]["megatron"]}
    )
    frame.on_exit(logger.close)
    judge = None
    if cfg.judge is not None:
        from .ppo.judging import make_judge

        judge = make_judge(cfg, roles.judge)
    batches = build_batches(
        cfg, roles.actor, dataset, sampler, tokenizer, runner, roles.reward, judge, roles.service, start, run_dir
    )
    trainer = PPOTrainer(
        cfg, roles.actor, roles.critic, batches, tokenizer, logger, start, test_dataset, roles.teacher, roles.evaluator
    )
    frame.on_exit(trainer.close)
    return trainer
