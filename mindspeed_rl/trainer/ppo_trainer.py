"""The PPO single controller. ``fit()`` is DESIGN.md's iteration list."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Dict, List

import numpy as np
import torch

from ..algorithms import compute_gae, group_norm_advantages, kl_penalty, make_kl_controller, masked_mean
from ..algorithms import masked_whiten, token_level_rewards
from ..config_cls.ppo_config import PPOConfig
from ..protocol import MODEL_INPUTS, Experience, build_experience, mini_batch_plan
from .metrics import data_metrics, throughput
from .prompts import PromptBatch, decode_responses


class NonFiniteStop(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient."""


class PPOTrainer:
    def __init__(self, cfg: PPOConfig, actor_group, critic_group, reward_runner, dataset, sampler, tokenizer,
                 logger, start_iteration: int = 0, reward_group=None):
        self.cfg, self.rl, self.gen = cfg, cfg.rl, cfg.generate
        self.actor, self.critic, self.reward_model = actor_group, critic_group, reward_group
        self.reward_runner, self.dataset, self.sampler = reward_runner, dataset, sampler
        self.tokenizer, self.logger = tokenizer, logger
        self.iteration = start_iteration
        self.kl_ctrl = make_kl_controller(self.rl.kl_ctrl_type, self.rl.init_kl_coef, self.rl.kl_target,
                                          self.rl.kl_horizon)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.timing: Dict[str, float] = {}
        self.use_critic = self.rl.adv_estimator == "gae"
        self.use_ref = self.rl.use_kl_in_reward or self.rl.init_kl_coef > 0 or self.rl.kl_ctrl_type == "adaptive"
        samples = cfg.samples_per_iteration
        self.skip_old_log_prob = (self.rl.epochs == 1 and samples == self.rl.mini_batch_size
                                  and not self.rl.use_kl_in_reward)
        self.history: List[Dict[str, float]] = []
        self.ref_from = None  # the original weights the reference was built from, for resumes

    @contextmanager
    def timer(self, name: str):
        start = time.perf_counter()
        yield
        self.timing[name] = self.timing.get(name, 0.0) + time.perf_counter() - start

    # ----- the iteration -----------------------------------------------------------------------------------
    def fit(self) -> List[Dict[str, float]]:
        while self.iteration < self.cfg.megatron_training.train_iters:
            self.timing = {}
            with self.timer("timing/all"):
                prompts = self.next_prompts()
                with self.timer("timing/rollout"):
                    exp = self.generate(prompts)
                if self.use_ref:
                    with self.timer("timing/reference_model"):
                        exp.set("ref_log_probs", self.log_probs(exp, "ref"))
                if not self.skip_old_log_prob:
                    with self.timer("timing/old_log_p"):
                        exp.set("old_log_probs", self.log_probs(exp, "actor"))
                if self.use_critic:
                    with self.timer("timing/critic_model"):
                        exp.set("values", self.values(exp))
                reward_metrics = self.score(exp)
                with self.timer("timing/adv"):
                    self.compute_advantages(exp)
                update_metrics = {}
                if self.use_critic:
                    with self.timer("timing/update_critic"):
                        update_metrics.update(self.update_critic(exp))
                with self.timer("timing/update"):
                    update_metrics.update(self.update_actor(exp))
            self.iteration += 1
            metrics = self.collect_metrics(exp, reward_metrics, update_metrics)
            self.logger.log(metrics)
            self.history.append(metrics)
            self.after_iteration(metrics)
        return self.history

    def after_iteration(self, metrics: Dict[str, float]) -> None:
        for role in ("actor", "critic"):
            streak = int(metrics.get(f"{role}/nonfinite_streak", 0))
            if streak >= self.rl.max_nonfinite_steps:
                raise NonFiniteStop(f"the {role}'s last {streak} optimizer steps had a NaN/Inf loss or gradient and "
                                    f"were skipped (rl_config.max_nonfinite_steps {self.rl.max_nonfinite_steps}); "
                                    f"iteration {self.iteration} is not saved")
        every = self.cfg.megatron_training.save_interval
        last = self.iteration == self.cfg.megatron_training.train_iters
        if self.iteration % every == 0 or last:
            self.save()

    def trainer_state(self) -> Dict:
        """What a resume needs besides the models: position in the data, the KL coefficient, where the
        reference came from. Sampling and mini-batch order are seeded from the iteration number."""
        return {"iteration": self.iteration, "consumed_samples": self.sampler.consumed_samples,
                "kl_ctrl": self.kl_ctrl.state_dict(), "ref_from": self.ref_from}

    def save(self) -> None:
        am, cm = self.cfg.actor.megatron, self.cfg.critic.megatron
        if not am.save:
            return
        start = time.perf_counter()
        extra = {"trainer_state": self.trainer_state()}
        self.actor.call("save", am.save, self.iteration, extra, not am.no_save_optim, not am.no_save_rng)
        if self.critic is not None and cm.save:
            self.critic.call("save", cm.save, self.iteration, extra, not cm.no_save_optim, not cm.no_save_rng)
        print(f"saved iteration {self.iteration}: actor -> {am.save}"
              + (f", critic -> {cm.save}" if self.critic is not None and cm.save else "")
              + f" ({time.perf_counter() - start:.1f}s)", flush=True)

    # ----- steps ---------------------------------------------------------------------------------------------
    def next_prompts(self) -> PromptBatch:
        indices = self.sampler.next_batch()
        items = [self.dataset[i] for i in indices]
        return PromptBatch([list(it["input_ids"]) for it in items], [it.get("labels", "") for it in items])

    def generate(self, prompts: PromptBatch) -> Experience:
        """Prompts split over the rollout engines; the sample seeds depend on the iteration only."""
        n = self.rl.n_samples_per_prompt
        seed = self.gen.sampling_config.seed + 1_000_003 * self.iteration
        generated = self.actor.generate(prompts.input_ids, n, seed)
        for key in ("timing/resharding_to_infer", "timing/resharding_to_train"):
            self.timing[key] = self.timing.get(key, 0.0) + generated.timing.get(key, 0.0)
        return build_experience(prompts.input_ids, generated.outputs, n, self.pad_id, prompts.labels)

    def log_probs(self, exp: Experience, which: str) -> torch.Tensor:
        results = self.actor.forward("compute_log_prob", exp, MODEL_INPUTS, which)
        for key in ("timing/ref_onload", "timing/ref_offload"):
            if key in results[0]:
                self.timing[key] = self.timing.get(key, 0.0) + results[0][key]
        return torch.cat([r["log_probs"] for r in results]).float()

    def values(self, exp: Experience) -> torch.Tensor:
        return torch.cat([r["values"] for r in self.critic.forward("compute_values", exp)]).float()

    def score(self, exp: Experience) -> Dict[str, float]:
        """Sequence scores: rule verifiers and/or the reward model, summed into ``exp.scores``."""
        scores = torch.zeros(exp.num_rows)
        metrics: Dict[str, float] = {}
        if self.rl.rule_reward:
            with self.timer("timing/rule_reward"):
                texts, outside = decode_responses(self.tokenizer, exp.response_ids, exp.response_mask)
                rule, metrics = self.reward_runner.score(texts, exp.labels)
            metrics["rollout/out_of_vocab_tokens"] = float(outside)
            scores = scores + rule
        if self.reward_model is not None:
            with self.timer("timing/reward_model"):
                rm = torch.cat([r["scores"] for r in self.reward_model.forward("compute_scores", exp)])
            metrics["reward_model/score/mean"] = float(rm.mean())
            scores = scores + rm.float()
        exp.set("scores", scores)
        return metrics

    def compute_advantages(self, exp: Experience) -> None:
        mask = exp.response_mask.float()
        kl = None
        if exp.ref_log_probs is not None:
            current = exp.old_log_probs if exp.old_log_probs is not None else exp.rollout_log_probs
            kl = kl_penalty(current, exp.ref_log_probs, self.rl.kl_penalty) * mask
            exp.set("kl", kl)
        coef = self.kl_ctrl.value if self.rl.use_kl_in_reward else 0.0
        exp.set("token_rewards", token_level_rewards(exp.scores, mask, kl, coef))
        if self.rl.adv_estimator == "gae":
            adv, ret = compute_gae(exp.token_rewards, exp.values, mask, self.rl.gamma, self.rl.lam)
        else:
            adv, ret = group_norm_advantages(exp.scores, mask, exp.group.tolist())
        if self.rl.whiten_advantages and self.rl.adv_estimator == "gae":
            adv = masked_whiten(adv, mask)
        exp.set("advantages", adv)
        exp.set("returns", ret)
        if kl is not None:
            self.kl_ctrl.update(float(masked_mean(kl, mask)), self.cfg.samples_per_iteration)

    def update_plan(self, exp: Experience) -> List[np.ndarray]:
        """Rows of every optimizer step (epochs x mini-batches), seeded by the iteration."""
        return mini_batch_plan(exp.num_rows, self.rl.mini_batch_size, self.rl.epochs, self.rl.shuffle_mini_batch,
                               self.cfg.megatron_training.seed + 7919 * self.iteration)

    def update_critic(self, exp: Experience) -> Dict[str, float]:
        return self.critic.update("update", exp, self.update_plan(exp), ("values", "returns"))

    def update_actor(self, exp: Experience) -> Dict[str, float]:
        fields = ["advantages"] + [k for k in ("old_log_probs", "ref_log_probs") if getattr(exp, k) is not None]
        return self.actor.update("update", exp, self.update_plan(exp), fields, self.kl_ctrl.value)

    def collect_metrics(self, exp: Experience, reward_metrics, update_metrics) -> Dict[str, float]:
        metrics: Dict[str, float] = {"iteration": self.iteration}
        metrics.update(data_metrics(exp))
        metrics.update(reward_metrics)
        metrics.update(update_metrics)
        metrics["actor/kl_coef"] = float(self.kl_ctrl.value)
        metrics.update(self.timing)
        metrics.update(throughput(metrics, self.cfg.megatron_training.global_batch_size,
                                  self.rl.n_samples_per_prompt, self.cfg.world_size))
        return metrics
