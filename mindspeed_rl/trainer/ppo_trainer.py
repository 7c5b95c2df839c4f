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
from .experience import MODEL_INPUTS, build_experience, mini_batch_plan, select, split_rows
from .metrics import data_metrics, throughput


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
                    batch = self.generate(prompts)
                if self.use_ref:
                    with self.timer("timing/reference_model"):
                        batch["ref_log_probs"] = self.log_probs(batch, "ref")
                if not self.skip_old_log_prob:
                    with self.timer("timing/old_log_p"):
                        batch["old_log_probs"] = self.log_probs(batch, "actor")
                if self.use_critic:
                    with self.timer("timing/critic_model"):
                        batch["values"] = self.values(batch)
                batch["scores"], reward_metrics = self.score(batch, prompts["labels"])
                with self.timer("timing/adv"):
                    self.compute_advantages(batch)
                update_metrics = {}
                if self.use_critic:
                    with self.timer("timing/update_critic"):
                        update_metrics.update(self.update_critic(batch))
                with self.timer("timing/update"):
                    update_metrics.update(self.update_actor(batch))
            self.iteration += 1
            metrics = self.collect_metrics(batch, reward_metrics, update_metrics)
            self.logger.log(metrics)
            self.history.append(metrics)
            self.after_iteration(metrics)
        return self.history

    def after_iteration(self, metrics: Dict[str, float]) -> None:
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
    def next_prompts(self) -> Dict:
        indices = self.sampler.next_batch()
        items = [self.dataset[i] for i in indices]
        return {"input_ids": [it["input_ids"] for it in items], "labels": [it.get("labels", "") for it in items]}

    def generate(self, prompts: Dict) -> Dict[str, torch.Tensor]:
        ids = prompts["input_ids"]
        ranks = len(self.actor.handles)
        shards = np.array_split(np.arange(len(ids)), ranks)
        seed = self.gen.sampling_config.seed + 1000 * self.iteration
        results = self.actor.call("generate", per_rank=[([ids[i] for i in s], self.rl.n_samples_per_prompt,
                                                         seed + 100 * r) for r, s in enumerate(shards)])
        outputs = []
        for shard, result in zip(shards, results):
            outputs += [(int(shard[o[0]]),) + tuple(o[1:]) for o in result["outputs"]]
        for key in ("timing/resharding_to_infer", "timing/resharding_to_train"):
            self.timing[key] = self.timing.get(key, 0.0) + max(r[key] for r in results)
        return build_experience(ids, outputs, self.rl.n_samples_per_prompt, self.pad_id)

    def _per_dp(self, group, method: str, batch: Dict[str, torch.Tensor], *extra) -> List[Dict]:
        """Send each DP group its rows (every rank of the group the same rows); results by DP rank."""
        chunks = split_rows(batch["input_ids"].shape[0], group.dp_size)
        args = [(select(batch, MODEL_INPUTS, chunks[lay["dp_rank"]]),) + extra for lay in group.layouts]
        results = group.call(method, per_rank=args)
        outputs = group.output_ranks()
        return [results[outputs[dp]] for dp in range(group.dp_size)]

    def log_probs(self, batch: Dict[str, torch.Tensor], which: str) -> torch.Tensor:
        results = self._per_dp(self.actor, "compute_log_prob", batch, which)
        for key in ("timing/ref_onload", "timing/ref_offload"):
            if key in results[0]:
                self.timing[key] = self.timing.get(key, 0.0) + results[0][key]
        return torch.cat([r["log_probs"] for r in results]).float()

    def values(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([r["values"] for r in self._per_dp(self.critic, "compute_values", batch)]).float()

    def score(self, batch: Dict[str, torch.Tensor], labels: List[str]):
        """Sequence scores: rule verifiers and/or the reward model, summed."""
        scores = torch.zeros(batch["input_ids"].shape[0])
        metrics: Dict[str, float] = {}
        if self.rl.rule_reward:
            with self.timer("timing/rule_reward"):
                rule, metrics = self.rule_rewards(batch, labels)
            scores = scores + rule
        if self.reward_model is not None:
            with self.timer("timing/reward_model"):
                rm = torch.cat([r["scores"] for r in self._per_dp(self.reward_model, "compute_scores", batch)])
            metrics["reward_model/score/mean"] = float(rm.mean())
            scores = scores + rm.float()
        return scores, metrics

    def rule_rewards(self, batch: Dict[str, torch.Tensor], labels: List[str]):
        n = self.rl.n_samples_per_prompt
        texts = [self.tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
                 for ids, mask in zip(batch["response_ids"], batch["response_mask"])]
        return self.reward_runner.score(texts, [labels[i // n] for i in range(len(texts))])

    def compute_advantages(self, batch: Dict[str, torch.Tensor]) -> None:
        mask = batch["response_mask"].float()
        kl = None
        if "ref_log_probs" in batch:
            current = batch.get("old_log_probs", batch["rollout_log_probs"])
            kl = kl_penalty(current, batch["ref_log_probs"], self.rl.kl_penalty) * mask
            batch["kl"] = kl
        coef = self.kl_ctrl.value if self.rl.use_kl_in_reward else 0.0
        batch["token_rewards"] = token_level_rewards(batch["scores"], mask, kl, coef)
        if self.rl.adv_estimator == "gae":
            adv, ret = compute_gae(batch["token_rewards"], batch["values"], mask, self.rl.gamma, self.rl.lam)
        else:
            adv, ret = group_norm_advantages(batch["scores"], mask, batch["group"].tolist())
        if self.rl.whiten_advantages and self.rl.adv_estimator == "gae":
            adv = masked_whiten(adv, mask)
        batch["advantages"], batch["returns"] = adv, ret
        if kl is not None:
            self.kl_ctrl.update(float(masked_mean(kl, mask)), self.cfg.samples_per_iteration)

    def _mini_batches(self, batch: Dict[str, torch.Tensor], group, keys) -> List[tuple]:
        plan = mini_batch_plan(batch["input_ids"].shape[0], self.rl.mini_batch_size, self.rl.epochs,
                               self.rl.shuffle_mini_batch, self.cfg.megatron_training.seed + 7919 * self.iteration)
        per_dp: List[List[Dict]] = [[] for _ in range(group.dp_size)]
        for rows in plan:
            normaliser = batch["response_mask"][rows].sum().float()
            for dp, part in enumerate(np.array_split(rows, group.dp_size)):
                mb = select(batch, list(MODEL_INPUTS) + list(keys), part)
                mb["normaliser"] = normaliser.clone()
                per_dp[dp].append(mb)
        return [(per_dp[lay["dp_rank"]],) for lay in group.layouts]

    def update_critic(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        results = self.critic.call("update", per_rank=self._mini_batches(batch, self.critic, ("values", "returns")))
        return results[0]

    def update_actor(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        keys = ["advantages"] + [k for k in ("old_log_probs", "ref_log_probs") if k in batch]
        args = self._mini_batches(batch, self.actor, keys)
        results = self.actor.call("update", per_rank=[a + (self.kl_ctrl.value,) for a in args])
        return results[0]

    def collect_metrics(self, batch, reward_metrics, update_metrics) -> Dict[str, float]:
        metrics: Dict[str, float] = {"iteration": self.iteration}
        metrics.update(data_metrics(batch))
        metrics.update(reward_metrics)
        metrics.update(update_metrics)
        metrics["actor/kl_coef"] = float(self.kl_ctrl.value)
        metrics.update(self.timing)
        metrics.update(throughput(metrics, self.cfg.megatron_training.global_batch_size,
                                  self.rl.n_samples_per_prompt, self.cfg.world_size))
        return metrics
