"""From a validated config to a running PPO job: Ray, placement, workers, data, the trainer. What happens when
the job fails (exit codes, dead workers, restarts) is ``failures.py``."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Dict, List, Tuple

from ..config_cls.loader import CONFIG_DIR
from ..config_cls.ppo_config import PPOConfig
from ..utils.cli import UserError, raise_if_terminated, raise_terminated, stop_on_sigterm
from ..utils.hf_tokenizer import load_tokenizer
from .failures import WorkerDied, describe_dead_worker, describe_worker_error, train_to_exit_code


def runtime_env_vars() -> Dict[str, str]:
    from ..config_cls.base import load_yaml

    data = load_yaml(os.path.join(CONFIG_DIR, "envs", "runtime_env.yaml")) or {}
    env = {k: str(v) for k, v in (data.get("env_vars") or {}).items()}
    for key in ("MINDSPEED_RL_DEVICE", "PYTHONWARNINGS"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def init_ray(env: Dict[str, str], quiet: bool = False) -> None:
    """Start (or join, with RAY_ADDRESS) Ray; ``quiet`` leaves Ray's driver logger to the handlers of
    ``library_logs.route_driver_logs``."""
    import ray

    if ray.is_initialized():
        return
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # no ANSI colour in the worker-log prefix of a log file
    address = os.environ.get("RAY_ADDRESS")
    kwargs = dict(
        runtime_env={"env_vars": env},
        include_dashboard=False,
        log_to_driver=True,
        logging_level="WARNING",
        configure_logging=not quiet,
    )
    import signal
    import threading

    own_handler = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if own_handler else None
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=os.cpu_count(), **kwargs)
    except SystemExit as exc:  # ray.init's own SIGTERM handler, in place while it runs, calls sys.exit(15)
        if exc.code != signal.SIGTERM:
            raise
        raise_terminated(signal.SIGTERM, None)
    finally:
        if own_handler:  # the handler ray.init installed (exit 15) gives way to the process's
            signal.signal(signal.SIGTERM, previous)


def describe_placement(pg) -> str:
    from ray.util.placement_group import placement_group_table

    nodes = placement_group_table(pg).get("bundles_to_node_id", {})
    return f"placement group: {len(nodes)} bundle(s) on {len(set(nodes.values()))} node(s)"


def existing_checkpoint(megatron) -> "str | None":
    """``load``, or None without one (pre-flight refused a resume from a folder with no checkpoint)."""
    return megatron.load or None


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

    return one("data_path"), one("test_data_path") if m.test_data_path else None


@dataclasses.dataclass
class Roles:
    """The worker groups of a run and the rollout service in front of the generating ones."""

    actor: Any
    service: Any
    critic: Any = None
    reward: Any = None
    teacher: Any = None
    judge: Any = None  # the judge's own engines (judge_config.serve engines)


def start_roles(cfg: PPOConfig, acc, pg, env: Dict[str, str], workers: List, log_dir, tokenizer, run_dir: str) -> Roles:
    """Every role's worker group on the placement group (appended to ``workers`` as each starts); side by side
    where the accelerator allows it (``roles_start_together``), else one after another."""
    from ..rollout.service import ColocatedRollout, DisaggregatedRollout
    from ..workers.actor_worker import IntegratedActorWorker
    from ..workers.critic_worker import CriticWorker
    from ..workers.launcher import connect_weight_channel, spawn_group, wait_until_built
    from ..workers.reward_worker import RewardWorker
    from ..workers.rollout_worker import RolloutWorker
    from ..workers.teacher_worker import TeacherWorker

    rl, gen = cfg.rl, cfg.generate
    devices, rollout_devices = cfg.actor.num_devices, cfg.rollout_devices
    cpus_per_bundle, threads = acc.bundle_cpus(cfg.world_size)
    whole_bundle = acc.bundle_spec(cpus_per_bundle)[acc.ray_resource]
    fraction = whole_bundle / len(cfg.colocated_roles)  # the roles share each bundle's device slot (CPU: its CPUs)
    steps = cfg.megatron_training.train_iters * (cfg.samples_per_iteration // rl.mini_batch_size) * rl.epochs
    ports: set = set()  # master ports of the groups still starting

    def spawn(name, cls, num_ranks, share, first_bundle=0, **kwargs):
        """One group of ranks; each rank gets its place in the group's torch.distributed world."""
        return spawn_group(
            name, cls, acc, pg, num_ranks, share,
            lambda rank, addr, port: dict(rank=rank, world_size=num_ranks, master_addr=addr, master_port=port,
                                          threads=threads, **kwargs),
            env, workers, log_dir, first_bundle=first_bundle, wait=not acc.roles_start_together, taken_ports=ports,
        )  # fmt: skip

    ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id or 0)
    roles = Roles(
        spawn("actor", IntegratedActorWorker, devices, fraction, role=cfg.actor, rl=rl, gen=gen, total_steps=steps,
              with_engine=not rollout_devices, **ids),
        service=None,
    )  # fmt: skip
    rollout = None
    if rollout_devices:  # disaggregated layout: the rollout workers' bundles follow the actor's
        rollout = spawn("rollout", RolloutWorker, rollout_devices, whole_bundle, first_bundle=devices,
                        model=cfg.actor.model, gen=gen, bf16=cfg.actor.megatron.bf16,
                        capture_routes=rl.router_replay is not None, **ids)  # fmt: skip
    if cfg.uses_critic:
        roles.critic = spawn("critic", CriticWorker, cfg.critic.num_devices, fraction, role=cfg.critic, rl=rl,
                             total_steps=steps, offload_when_idle=acc.offload_when_idle)  # fmt: skip
    if cfg.reward is not None:
        roles.reward = spawn("reward", RewardWorker, cfg.reward.num_devices, fraction, role=cfg.reward, rl=rl)
    if cfg.teacher is not None:  # colocated: offloaded when idle where the device offloads; else after the others
        roles.teacher = spawn("teacher", TeacherWorker, cfg.teacher.num_devices,
                              fraction if rl.teacher_colocate else whole_bundle,
                              first_bundle=0 if rl.teacher_colocate else devices + rollout_devices, role=cfg.teacher,
                              rl=rl, offload_when_idle=rl.teacher_colocate and acc.offload_when_idle)  # fmt: skip
    if cfg.judge_devices:  # the judge's engines on the last bundles
        from ..workers.judge_worker import JudgeWorker
        from .judging import judge_hf_folder

        first = devices + rollout_devices + cfg.teacher_devices
        roles.judge = spawn("judge", JudgeWorker, cfg.judge_devices, whole_bundle, first_bundle=first,
                            judge=cfg.judge, hf_dir=judge_hf_folder(cfg, run_dir))  # fmt: skip
    wait_until_built(workers)
    if rollout is not None:
        transfer = connect_weight_channel(pg, roles.actor, rollout)
        roles.service = DisaggregatedRollout(roles.actor, rollout)
        print(f"rollout workers (disaggregated): {rollout.describe_engines()}; weights over {transfer}", flush=True)
    else:
        roles.service = ColocatedRollout(roles.actor)
        print(f"rollout engines: {roles.actor.describe_engines()}", flush=True)
    return roles


def load_models(cfg: PPOConfig, roles: Roles, resume_at) -> Tuple[int, Dict]:
    """Weights (and on a resume optimizer, RNG) into every role; returns (first iteration, trainer state)."""
    am, cm, rl = cfg.actor.megatron, cfg.critic.megatron, cfg.rl
    if roles.reward is not None:
        roles.reward.call("init_weights", cfg.reward.megatron.load)
    if roles.teacher is not None:
        roles.teacher.call("init_weights", cfg.teacher.megatron.load)
    actor_load, critic_load = existing_checkpoint(am), existing_checkpoint(cm)
    resumed = roles.actor.call("init_weights", actor_load, am.finetune, not am.no_load_optim, not am.no_load_rng,
                               rl.integrated_mode_config.ref_model_load_path, resume_at)[0]  # fmt: skip
    if roles.critic is not None:
        roles.critic.call("init_weights", critic_load, cm.finetune, not cm.no_load_optim, not cm.no_load_rng,
                          resume_at)  # fmt: skip
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
    return keys


SHUTDOWN_GRACE_S = 5.0  # then workers still busy (starting up, stuck in a collective) are killed


def stop_all(workers: List, pg, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Every worker group asked to shut down (all at once), and its processes killed now (not when the handles
    are collected) or after ``grace_s``: a shutdown queues behind the call a worker is in, e.g. its start-up,
    which a SIGTERM must not wait out."""
    import ray

    asked = [ref for group in workers for ref in group.call_async("shutdown")]
    if asked:
        ray.wait(asked, num_returns=len(asked), timeout=grace_s)  # a dead worker's answer is its error: ready
    for group in workers:
        for handle in group.handles:
            ray.kill(handle, no_restart=True)
    if pg is not None:
        ray.util.remove_placement_group(pg)


def train(cfg: PPOConfig) -> List[Dict[str, float]]:
    import ray

    from ..accelerator import get_accelerator
    from ..config_cls import batch_plan
    from ..config_cls.ppo_config import to_plain
    from ..datasets.prompt_dataset import PromptSampler
    from ..rewards.runner import RuleRewardRunner
    from ..workers.launcher import create_placement_group
    from .loggers import MetricsLogger
    from .ppo_trainer import PPOTrainer
    from .preflight import preflight
    from .report import write_run_info

    mt, rl = cfg.megatron_training, cfg.rl
    tokenizer = load_tokenizer(cfg.actor.megatron.tokenizer_name_or_path, "megatron_training.tokenizer_name_or_path")
    dataset, test_dataset = open_prompts(cfg)
    run_dir = os.path.abspath(os.path.join(rl.log_dir, time.strftime("%Y%m%d-%H%M%S")))
    log_dir = os.path.join(run_dir, "logs") if rl.library_logs == "file" else None
    print(f"run directory: {run_dir} (metrics.jsonl, curves, report.html"
          + (", logs/ of vLLM, Ray and megatron)" if log_dir else ")"), flush=True)  # fmt: skip
    print(f"prompts: {len(dataset)} from {cfg.actor.megatron.data_path} ({dataset.dropped} over max_prompt_length)"
          + (f"; test prompts: {len(test_dataset)} from {cfg.actor.megatron.test_data_path}" if test_dataset else ""),
          flush=True)  # fmt: skip
    resolved = {k: v for k, v in to_plain(cfg).items() if k != "raw"}
    write_run_info(run_dir, cfg.raw, resolved, batch_plan(cfg), sys.argv)
    started = time.perf_counter()
    resume_at = preflight(cfg)
    raise_if_terminated()  # (a SIGTERM whose exception a __del__ dropped: here, between phases, and each iteration)
    acc, env = get_accelerator(), runtime_env_vars()
    workers: List = []  # groups started so far, for the clean-up
    runner = logger = pg = undo_routing = trainer = None
    try:
        if log_dir:
            from ..utils.library_logs import route_driver_logs

            undo_routing = route_driver_logs(log_dir)
        init_ray(env, quiet=bool(log_dir))
        bundles = (
            cfg.world_size
        )  # the actor's devices, then the rollout workers', a teacher's and a judge's of their own
        pg = create_placement_group(acc, bundles, acc.bundle_cpus(bundles)[0], placement_keys(cfg))
        print(describe_placement(pg), flush=True)
        raise_if_terminated()
        roles = start_roles(cfg, acc, pg, env, workers, log_dir, tokenizer, run_dir)
        start, state = load_models(cfg, roles, resume_at)
        raise_if_terminated()
        sampler = PromptSampler(len(dataset), mt.global_batch_size, mt.seed, shuffle=not mt.no_shuffle)
        if rl.rule_reward:
            runner = RuleRewardRunner(rl.verifier_function, rl.verifier_weight, rl.verifier_timeout,
                                      workers=max(1, int(rl.num_cpus_for_local_task)))  # fmt: skip
        logger = MetricsLogger(run_dir, mt.train_iters, rl,
                               {"rl_config": resolved["rl"], "actor": resolved["actor"]["megatron"]})  # fmt: skip
        judge = None
        if cfg.judge is not None:
            from .judging import make_judge

            judge = make_judge(cfg, roles.judge)
        trainer = PPOTrainer(cfg, roles.actor, roles.critic, runner, dataset, sampler, tokenizer, logger, start,
                             roles.reward, test_dataset, rollout_service=roles.service,
                             teacher_group=roles.teacher, judge=judge)  # fmt: skip
        trainer.load_trainer_state(state)
        print(f"workers ready in {time.perf_counter() - started:.1f}s (Ray, placement, models, rollout engines, "
              "checkpoints)", flush=True)  # fmt: skip
        if start:
            print(f"resumed at iteration {start} from {cfg.actor.megatron.load} (consumed samples "
                  f"{sampler.consumed_samples})", flush=True)  # fmt: skip
        history = trainer.fit()
    except ray.exceptions.RayActorError as exc:
        raise WorkerDied(describe_dead_worker(exc, workers, cfg)) from None
    except ray.exceptions.RayTaskError as exc:
        raise describe_worker_error(exc, workers, cfg, run_dir) from None
    finally:
        if trainer is not None:
            trainer.close()
        if runner is not None:
            runner.close()
        if logger is not None:
            logger.close()
        stop_all(workers, pg)
        if undo_routing is not None:
            undo_routing()
    if log_dir:
        from ..utils.library_logs import summary_line

        line = summary_line(log_dir)
        if line:
            print(line, flush=True)
    print(f"run directory: {run_dir}", flush=True)
    return history
