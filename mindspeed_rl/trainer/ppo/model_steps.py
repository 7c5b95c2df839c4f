"""The iteration's calls on the model workers: the reference's, the old and the critic's forwards, and the two updates.
They run in turn, or, with ``rl_config.blocking: false`` and a critic, the critic's beside the actor's worker's
(the values beside the reference's and old log-probs, the critic's update beside the actor's): no call needs
the other's result, and each is told how many run at once so that a device whose cores the roles share (the CPU)
gives each its part of them (``Accelerator.sharing_cores``)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch

from ...protocol import ACTOR_INPUTS, MODEL_INPUTS, Experience, ForwardAnswer, mini_batch_plan
from ...utils.clock import Clock

# a lane: the calls one worker group runs in order, each (its phase's timing key, its ranks' result references)
Lane = Sequence[Tuple[str, List[Any]]]


def wait_side_by_side(clock: Clock, lanes: Sequence[Lane]) -> None:
    """Wait for every lane's calls, submitted together just now; each call's seconds and span go to ``clock``: it
    starts when the call before it in its lane ends (the first: now) and ends when its last rank answers."""
    import ray

    start = time.time()
    begins, nexts = [start] * len(lanes), [0] * len(lanes)
    left = [ref for lane in lanes for _, refs in lane for ref in refs]
    while left:
        _, left = ray.wait(left, num_returns=1)
        now, waiting = time.time(), set(left)
        for i, lane in enumerate(lanes):
            while nexts[i] < len(lane) and not waiting.intersection(lane[nexts[i]][1]):
                clock.record(lane[nexts[i]][0], begins[i], now)
                begins[i], nexts[i] = now, nexts[i] + 1


def forward_fields(which: str) -> Sequence[str]:
    """The experience fields a forward of the actor's worker takes: the actor's ("actor") or the reference's."""
    return ACTOR_INPUTS if which == "actor" else MODEL_INPUTS


class ModelSteps:
    """The PPO trainer's calls on its actor, critic and teacher groups (``self.actor``, ``self.critic``,
    ``self.teacher``), timed on ``self.clock``; the forwards' metrics go to ``self.forward_metrics``."""

    def side_by_side(self) -> bool:
        """rl_config.blocking false with a critic: its calls run beside the actor's worker's."""
        return not self.rl.blocking and self.use_critic

    def forwards(self, exp: Experience) -> None:
        """The reference's and the old log-probs (when the algorithm takes them) and the values (with a critic)."""
        on_actor = [("timing/reference_model", "ref_log_probs", "ref")] if self.use_ref else []
        if not self.skip_old_log_prob:
            on_actor.append(("timing/old_log_p", "old_log_probs", "actor"))
        if not self.side_by_side():
            for name, field, which in on_actor:
                with self.timer(name):
                    exp.set(field, self.log_probs(exp, which))
            if self.use_critic:
                with self.timer("timing/critic_model"):
                    exp.set("values", self.values(exp))
            return
        ways, balance = 2 if on_actor else 1, self.rl.use_dp_batch_balance
        values = self.critic.submit_forward("compute_values", exp, balance=balance, ways=ways)
        logps = [
            self.actor.submit_forward("compute_log_prob", exp, forward_fields(which), which, balance=balance, ways=ways)
            for _, _, which in on_actor
        ]
        lanes = [[(name, p.refs) for (name, _, _), p in zip(on_actor, logps)], [("timing/critic_model", values.refs)]]
        wait_side_by_side(self.clock, lanes)
        for (_, field, _), pending in zip(on_actor, logps):
            exp.set(field, self.taken(self.actor.collect_forward(pending)))
        exp.set("values", self.critic.collect_forward(values).per_row.float())

    def updates(self, exp: Experience) -> Dict[str, float]:
        """The critic's update (with a critic), then the actor's, or both at once; their metrics."""
        if self.side_by_side():
            critic, actor = self.submit_critic_update(exp, ways=2), self.submit_actor_update(exp, ways=2)
            wait_side_by_side(self.clock, [[("timing/update", actor)], [("timing/update_critic", critic)]])
            return {**self.critic.collect_update(critic), **self.actor.collect_update(actor)}
        metrics: Dict[str, float] = {}
        if self.use_critic:
            with self.timer("timing/update_critic"):
                metrics.update(self.critic.collect_update(self.submit_critic_update(exp)))
        with self.timer("timing/update"):
            metrics.update(self.actor.collect_update(self.submit_actor_update(exp)))
        return metrics

    def log_probs(self, exp: Experience, which: str) -> torch.Tensor:
        return self.taken(
            self.actor.forward(
                "compute_log_prob", exp, forward_fields(which), which, balance=self.rl.use_dp_batch_balance
            )
        )

    def teacher_log_probs(self, exp: Experience) -> torch.Tensor:
        return self.taken(self.teacher.forward("compute_log_prob", exp, balance=self.rl.use_dp_batch_balance))

    def taken(self, answer: ForwardAnswer) -> torch.Tensor:
        """A forward's per-row values; its phases (onload/offload of a model waiting on host) join the
        iteration's timing, its metrics (router replay's mismatch) the iteration's metrics."""
        for key, seconds in answer.timing.items():
            self.clock.add(key, seconds)
        self.forward_metrics.update(answer.metrics)
        return answer.per_row.float()

    def values(self, exp: Experience) -> torch.Tensor:
        return self.critic.forward("compute_values", exp, balance=self.rl.use_dp_batch_balance).per_row.float()

    def update_plan(self, exp: Experience) -> List[np.ndarray]:
        """Rows of every optimizer step (epochs x mini-batches), seeded by the iteration."""
        return mini_batch_plan(
            exp.num_rows,
            self.rl.mini_batch_size,
            self.rl.epochs,
            self.rl.shuffle_mini_batch,
            self.cfg.megatron_training.seed + 7919 * self.iteration,
        )

    def submit_critic_update(self, exp: Experience, ways: int = 1) -> List[Any]:
        return self.critic.submit_update(
            "update",
            exp,
            self.update_plan(exp),
            ("values", "returns"),
            horizon=self.gen.sampling_config.max_tokens,
            balance=self.rl.use_dp_batch_balance,
            ways=ways,
        )

    def submit_actor_update(self, exp: Experience, ways: int = 1) -> List[Any]:
        fields = ["advantages"] + [
            k
            for k in ("old_log_probs", "ref_log_probs", "rollout_is_weights", "routed_experts")
            if getattr(exp, k) is not None
        ]
        return self.actor.submit_update(
            "update",
            exp,
            self.update_plan(exp),
            fields,
            self.kl_ctrl.value,
            horizon=self.gen.sampling_config.max_tokens,
            balance=self.rl.use_dp_batch_balance,
            ways=ways,
        )
