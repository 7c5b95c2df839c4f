"""The single controller. ``fit()`` is the iteration list of docs/ppo.md ("One iteration"); the algorithm
registry (``cfg.algorithm``) decides which models take part and how advantages and losses are computed."""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import contextmanager
from typing import Dict, List

import torch

from ...algorithms.advantages import estimate, sequence_rewards, token_level_rewards
from ...algorithms.distillation import distill_advantages, mix_advantages, teacher_student_kl
from ...algorithms.kl import controller_kl, kl_penalty, make_kl_controller
from ...algorithms.rollout_correction import mismatch_metrics, truncated_is_weights
from ...config_cls.ppo_config import PPOConfig
from ...datasets.prompt_dataset import PromptBatch
from ...features.algorithm import skips_old_log_prob
from ...protocol import Experience, build_experience
from ...rollout.experts.expert_load import ExpertLoad
from ...rollout.service import DisaggregatedRollout
from ...utils.cli import raise_if_terminated
from ...utils.clock import Clock
from ..report.metrics import data_metrics, throughput, timeline_spans
from ..runtime.guards import TooFewEngines, next_collapse_streak, save_due, stop_on_nonfinite_steps
from .batches import Batches
from .evaluation import SuiteEvaluation, validation_metrics
from .model_steps import ModelSteps


def format_validation(metrics: Dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in metrics.items())


class PPOTrainer(ModelSteps):
    def __init__(
        self,
        cfg: PPOConfig,
        actor_group,
        critic_group,
        batches: Batches,
        tokenizer,
        logger,
        start_iteration: int = 0,
        test_dataset=None,
        teacher_group=None,
        eval_group=None,
    ):
        """``batches`` (trainer/ppo/batches.py): the rollout service, the scorer, the rollout source and the sampler,
        built by ``build_batches`` with the service holding the weights of ``start_iteration``."""
        self.cfg, self.rl, self.gen = cfg, cfg.rl, cfg.generate
        self.actor, self.critic, self.teacher = actor_group, critic_group, teacher_group
        self.batches, self.sampler = batches, batches.sampler
        self.test_prompts = PromptBatch.of(test_dataset, range(len(test_dataset))) if test_dataset is not None else None
        self.logger = logger
        self.iteration = start_iteration
        self.algorithm = cfg.algorithm
        self.kl_ctrl = make_kl_controller(
            self.rl.kl_ctrl_type, self.rl.init_kl_coef, self.rl.kl_target, self.rl.kl_horizon
        )
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.clock = Clock()
        self.use_critic, self.use_ref = self.algorithm.use_critic, self.algorithm.use_reference
        # generation (version = updates applied to the actor's weights), scoring, and how batches are produced:
        # rollout function x scoring stage x group filter x schedule (rollout/source/rollout_source.py)
        self.rollout_service, self.scorer, self.source = batches.service, batches.scorer, batches.source
        # samples of older policy versions: old log-probs recomputed, stale tokens importance-weighted
        self.off_policy = self.source.off_policy
        self.skip_old_log_prob = skips_old_log_prob(cfg, self.off_policy)
        self.history: List[Dict[str, float]] = []
        self.collapse_streak = 0  # iterations in a row with a collapsed policy (rl_config.max_collapsed_iterations)
        self.ref_from = None  # the original weights the reference was built from, for resumes
        self.forward_metrics: Dict[str, float] = {}  # an iteration's metrics from the actor's forwards
        self.expert_load = ExpertLoad.of_run(cfg.generate, cfg.actor, getattr(logger, "run_dir", "."))
        self.evaluation = SuiteEvaluation(cfg, tokenizer, eval_group) if cfg.evaluation is not None else None

    @contextmanager
    def timer(self, name: str):
        with self.clock.measure(name):
            yield

    # ----- the iteration -----------------------------------------------------------------------------------
    def fit(self) -> List[Dict[str, float]]:
        val_metrics = self.validate() if self.rl.val_before_train and self.test_prompts is not None else {}
        if val_metrics:
            print("validation before training: " + format_validation(val_metrics), flush=True)
        if self.evaluation is not None and self.evaluation.ev.before_train:
            val_metrics.update(self.evaluation.run(self.source, self.iteration))
        if val_metrics:
            self.logger.record({"iteration": self.iteration, **val_metrics})
        while self.iteration < self.cfg.megatron_training.train_iters:
            raise_if_terminated()
            self.clock = Clock()
            started = time.time()
            version = self.rollout_service.version  # the policy that samples this iteration
            self.forward_metrics = {}
            self.profile_at(self.iteration + 1)
            with self.timer("timing/all"):
                waiting = time.perf_counter()
                batch = self.source.next_batch(self.iteration)
                self.clock.add("timing/trainer_idle", time.perf_counter() - waiting)
                self.clock.merge(batch.clock)
                exp, reward_metrics = batch.experience, dict(batch.metrics)
                self.count_expert_load(exp)
                if self.teacher is not None:
                    with self.timer("timing/teacher"):
                        exp.set("teacher_log_probs", self.teacher_log_probs(exp))
                self.forwards(exp)  # the reference's, the old log-probs, the values
                with self.timer("timing/adv"):
                    self.compute_advantages(exp)
                    reward_metrics.update(self.add_distillation(exp))
                    reward_metrics.update(self.correct_rollout(exp))
                update_metrics = self.updates(exp)
                self.source.settle(self.clock)  # the batches produced ahead keep the weights they started with
                with self.timer("timing/weight_sync"):
                    self.rollout_service.update_weights(self.iteration + 1)
            self.iteration += 1
            if self.validation_due():
                with self.timer("timing/validation"):
                    reward_metrics.update(self.validate())
            if self.evaluation is not None:
                reward_metrics.update(self.evaluation.step(self.source, self.iteration, self.logger, self.clock))
            metrics = self.collect_metrics(exp, reward_metrics, update_metrics, version)
            self.logger.log(metrics)
            disaggregated = isinstance(self.rollout_service, DisaggregatedRollout)
            self.logger.timeline(self.iteration, started, time.time(), timeline_spans(self.clock, disaggregated))
            self.history.append(metrics)
            self.after_iteration(metrics)
        if self.evaluation is not None and self.history:  # the own engines' last results: the last iteration's row
            for late in self.evaluation.finish(self.iteration, self.logger):
                self.history[-1].update(late)
        return self.history

    def count_expert_load(self, exp: Experience) -> None:
        """The rollout's tokens per expert (EPLB), saved each iteration; routes captured for these alone go."""
        if self.expert_load is not None and exp.routed_experts is not None:
            self.expert_load.add(exp.routed_experts)
            self.expert_load.save()
        if not self.rl.router_replay:
            exp.routed_experts = None

    def profile_at(self, iteration: int) -> None:
        """The profiled roles (profiler_config) learn the iteration starting (1-based) and the run's trace folder."""
        for role, group in ((self.cfg.actor, self.actor), (self.cfg.critic, self.critic)):
            if role.profiler is not None and group is not None:
                group.call("profile_at", iteration, os.path.join(self.logger.run_dir, "profiler"))

    def close(self) -> None:
        """Release the rollout source's threads and the judge's, and the evaluation's scorers."""
        self.batches.close()
        if self.evaluation is not None:
            self.evaluation.close()

    def validation_due(self) -> bool:
        """Every test_freq iterations and at the last one, when validation is on."""
        if self.test_prompts is None:
            return False
        last = self.iteration == self.cfg.megatron_training.train_iters
        return last or (self.rl.test_freq > 0 and self.iteration % self.rl.test_freq == 0)

    def validate(self) -> Dict[str, float]:
        """The test set on the rollout engines with the current weights (val_kwargs sampling, greedy by
        default), scored by the rule verifiers (the metrics: evaluation.validation_metrics)."""
        if self.test_prompts is None:
            return {}
        val, prompts = self.rl.val_kwargs, self.test_prompts
        sampling = dataclasses.replace(self.gen.sampling_config, temperature=val.temperature, top_p=val.top_p)
        outputs, rollout_metrics = self.source.evaluate(prompts, val.n, self.gen.sampling_config.seed, sampling)
        exp = build_experience(
            prompts.input_ids, outputs, val.n, self.pad_id, prompts.labels, self.rollout_service.version
        )
        per_verifier, _ = self.scorer.verify(exp)
        metrics = validation_metrics(per_verifier, self.scorer.reward_runner, self.rl.verifier_function[0], val.n, exp)
        if "tool_calls/rate" in rollout_metrics:
            metrics["val/tool_calls/rate"] = rollout_metrics["tool_calls/rate"]
        return metrics

    def after_iteration(self, metrics: Dict[str, float]) -> None:
        """The guards (trainer/runtime/guards.py: a non-finite or collapse streak stops the run), then the save every
        save_interval iterations and at the last one, unless the policy looks collapsed."""
        limit = self.rl.max_collapsed_iterations
        stop_on_nonfinite_steps(metrics, self.rl.max_nonfinite_steps, self.iteration)
        self.collapse_streak = next_collapse_streak(metrics, self.collapse_streak, limit)
        saved = save_due(metrics, self.collapse_streak, self.iteration, limit, self.cfg.megatron_training)
        if saved:
            self.save()
        too_few = self.rollout_service.stop_reason
        if too_few is not None:
            if not saved:
                self.save()
            raise TooFewEngines(f"{too_few}; iteration {self.iteration} finished")

    def trainer_state(self) -> Dict:
        """What a resume needs besides the models: position in the data, the KL coefficient, where the
        reference came from, the rollout source's trajectories (parked, produced ahead, in the filter).
        Sampling and mini-batch order are seeded from the iteration number."""
        state = {
            "iteration": self.iteration,
            "consumed_samples": self.sampler.consumed_samples,
            "kl_ctrl": self.kl_ctrl.state_dict(),
            "ref_from": self.ref_from,
        }
        state["rollout_source"] = self.source.state_dict()
        if self.expert_load is not None:
            state["expert_load"] = self.expert_load.state_dict()
        return state

    def load_trainer_state(self, state: Dict) -> None:
        """Everything ``trainer_state`` saved (an empty state: a fresh start). The reference's origin is, in
        order: rl_config's ref_model_load_path, the one recorded by the first run, the finetune load."""
        self.sampler.consumed_samples = int(state.get("consumed_samples", 0))
        am = self.cfg.actor.megatron
        self.ref_from = (
            self.cfg.rl.integrated_mode_config.ref_model_load_path
            or state.get("ref_from")
            or (am.load if am.finetune else None)
        )
        if "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.source.load_state_dict(state)
        if self.expert_load is not None:
            self.expert_load.load_state_dict(state.get("expert_load"))

    def save(self) -> None:
        am, cm = self.cfg.actor.megatron, self.cfg.critic.megatron
        if not am.save:
            return
        start = time.perf_counter()
        extra = {"trainer_state": self.trainer_state()}
        hf = [self.actor.call("save", am.save, self.iteration, extra, not am.no_save_optim, not am.no_save_rng)[0]]
        if self.critic is not None and cm.save:
            hf.append(
                self.critic.call("save", cm.save, self.iteration, extra, not cm.no_save_optim, not cm.no_save_rng)[0]
            )
        print(
            f"saved iteration {self.iteration}: actor -> {am.save}"
            + (f", critic -> {cm.save}" if self.critic is not None and cm.save else "")
            + ("; HF: " + ", ".join(p for p in hf if p) if any(hf) else "")
            + f" ({time.perf_counter() - start:.1f}s)",
            flush=True,
        )
        if self.evaluation is not None:  # engines of their own evaluate the saved HF folder when it is due
            self.evaluation.saved(self.iteration)

    # ----- steps ---------------------------------------------------------------------------------------------
    def compute_advantages(self, exp: Experience) -> None:
        """KL (when a reference is used), token rewards (score on the last token, - beta x KL when the KL
        is in the reward), then the registered estimator."""
        mask = exp.loss_mask
        kl = None
        if exp.ref_log_probs is not None:
            current = exp.old_log_probs if exp.old_log_probs is not None else exp.rollout_log_probs
            kl = torch.where(mask.bool(), kl_penalty(current, exp.ref_log_probs, self.rl.kl_penalty), 0.0)
            exp.set("kl", kl)
        beta = self.kl_ctrl.value if self.algorithm.kl_in_reward else 0.0
        exp.set("token_rewards", token_level_rewards(exp.scores, mask.float(), kl, beta))
        adv, ret = estimate(
            self.algorithm.estimator,
            token_rewards=exp.token_rewards,
            sequence_rewards=sequence_rewards(exp.token_rewards, mask, exp.scores),
            values=exp.values,
            mask=mask,
            group=exp.group,
            gamma=self.rl.gamma,
            lam=self.rl.lam,
            whiten=self.rl.whiten_advantages,
        )
        exp.set("advantages", adv)
        exp.set("returns", ret)
        if kl is not None:
            self.kl_ctrl.update(controller_kl(kl, mask), exp.num_rows)

    def add_distillation(self, exp: Experience) -> Dict[str, float]:
        """On-policy distillation (rl_config.distill_coef > 0): the teacher's per-token advantage against the
        policy that sampled (old log-probs, else the rollout's) mixed into the reward advantages; the
        teacher-student KL as a metric."""
        signal = self.algorithm.distill
        if signal is None:
            return {}
        mask = exp.loss_mask
        student = exp.old_log_probs if exp.old_log_probs is not None else exp.rollout_log_probs
        distill = distill_advantages(signal, student, exp.teacher_log_probs, mask, self.rl.distill_clip)
        exp.set("advantages", mix_advantages(exp.advantages, distill, self.rl.distill_coef, mask))
        valid = mask.bool()
        return {
            "distill/teacher_kl": teacher_student_kl(student, exp.teacher_log_probs, mask),
            "distill/advantage_mean": float(distill[valid].mean()) if valid.any() else 0.0,
        }

    def correct_rollout(self, exp: Experience) -> Dict[str, float]:
        """Rollout/trainer mismatch metrics, and the truncated importance weights: on every loss token when
        rollout_is is on; else, with partial or asynchronous rollout, token-level on the stale tokens (sampled
        by an older policy version) and 1 on the others."""
        if exp.old_log_probs is None:
            return {}
        threshold = self.rl.rollout_correction.rollout_is_threshold
        metrics = mismatch_metrics(exp.old_log_probs, exp.rollout_log_probs, exp.loss_mask)
        if self.algorithm.rollout_is:
            weights, is_metrics = truncated_is_weights(
                exp.old_log_probs, exp.rollout_log_probs, exp.loss_mask, self.algorithm.rollout_is, threshold
            )
            exp.set("rollout_is_weights", weights)
            metrics.update(is_metrics)
        elif self.off_policy:
            stale = exp.loss_mask.bool() & (exp.policy_version < self.rollout_service.version)
            if stale.any():
                weights, is_metrics = truncated_is_weights(
                    exp.old_log_probs, exp.rollout_log_probs, stale, "token", threshold
                )
                exp.set("rollout_is_weights", torch.where(stale, weights, exp.loss_mask.float()))
                metrics.update(is_metrics)
        return metrics

    def collect_metrics(self, exp: Experience, reward_metrics, update_metrics, version: int) -> Dict[str, float]:
        metrics: Dict[str, float] = {"iteration": self.iteration}
        metrics.update(data_metrics(exp, version))
        metrics.update(reward_metrics)
        metrics.update(self.forward_metrics)
        metrics.update(update_metrics)
        metrics["actor/kl_coef"] = float(self.kl_ctrl.value)
        metrics.update(self.clock.timing)
        metrics.update(self.rollout_service.health_metrics())
        metrics.update(throughput(metrics, exp.num_rows, self.cfg.world_size))
        return metrics
