"""The rollout source: where the trainer gets each iteration's scored batch, and the state a resume needs.

It stacks three layers, each one class to swap (docs/rollout.md):

    rollout function   how one trajectory advances: single turn, the tool agent, a user's (agent_loop.py)
    group filter       which finished prompt groups a batch keeps: all, or dynamic sampling (group_filter.py)
    schedule           when trajectories generate: synchronous, partial chunks, ahead by L versions
                       (schedules.py)

One production (one batch) runs the loop: offer every finished group to the filter (scored first);
stop once the filter is satisfied and the schedule wants nothing more generated; else draw a global batch
of prompts when the schedule wants more growing and the filter may still draw; else run a round
(rounds.py). Every combination of the layers runs this same loop.

    source = RolloutSource.from_config(cfg, service, dataset, sampler, tokenizer, score)
    batch = source.next_batch(iteration)      # .experience (scored), .metrics, .clock
    source.settle()                           # before the actor's weights change
    state = source.state_dict()               # parked trajectories, batches produced ahead, the filter
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..config_cls.base import ConfigError
from ..config_cls.generate_config import SamplingConfig
from ..datasets.prompt_dataset import PromptBatch
from ..protocol import Experience, RolloutOutput, build_experience, by_prompt
from ..utils.clock import Clock
from .agent_loop import AgentContext, AgentSettings, RolloutFunction, ToolFormat, build_rollout_function
from .group_filter import DynamicSampling, GroupFilter, KeepAll
from .rounds import TrajectoryPool
from .schedules import Ahead, Chunked, Synchronous, schedule_metrics
from .trajectory import Trajectory, from_partial_pool, group_outputs

# score(experience, clock) -> (metrics, each verifier's values per row); sets experience.scores
# score(exp, clock) or, with the judge's verdicts asked earlier (trainer/scoring.py), score(exp, clock, judged)
Score = Callable[..., Tuple[Dict[str, float], Dict[str, torch.Tensor]]]


class SeedStream:
    """Sample seeds handed out in order: a round's request j is seeded ``base + j`` and the next round starts
    where it ended, so no two samples of a run share a seed (in the 32 bits torch's CPU generator keeps) until
    2**32 samples. Where a stream starts is a hash of the user's seed and the stream's name: runs with seeds one
    apart draw unrelated streams. ``used`` is part of the source's state, so a resume continues the stream."""

    def __init__(self, seed: int, name: str, used: int = 0) -> None:
        digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=4).digest()
        self.start, self.used = int.from_bytes(digest, "little"), used

    def take(self, count: int) -> int:
        base = (self.start + self.used) % 2**32
        self.used += count
        return base


@dataclass
class Produced:
    """One batch as produced: its prompt groups (n trajectories each, scored), metrics, the production's
    clock and wall time, the policy version it started with."""

    iteration: int
    version: int
    groups: List[List[Trajectory]]
    metrics: Dict[str, float] = field(default_factory=dict)
    clock: Clock = field(default_factory=Clock)
    seconds: float = 0.0

    def state(self) -> Dict:
        return {
            "iteration": self.iteration,
            "version": self.version,
            "groups": [[t.state() for t in g] for g in self.groups],
            "metrics": dict(self.metrics),
            "timing": dict(self.clock.timing),
            "seconds": self.seconds,
        }

    @staticmethod
    def from_state(state: Dict) -> "Produced":
        clock = Clock()
        clock.timing.update(state.get("timing", {}))
        return Produced(
            int(state["iteration"]), int(state["version"]),
            [[Trajectory.from_state(t) for t in g] for g in state["groups"]],
            dict(state.get("metrics", {})), clock, float(state.get("seconds", 0.0)),
        )  # fmt: skip


@dataclass
class RolloutBatch:
    """What the trainer gets: the scored experience, the rollout's metrics and its clock."""

    experience: Experience
    metrics: Dict[str, float]
    clock: Clock


class RolloutSource:
    def __init__(
        self,
        service,
        function: RolloutFunction,
        group_filter: GroupFilter,
        schedule,
        draw: Callable[[], PromptBatch],
        score: Score,
        n: int,
        max_tokens: int,
        seed: int,
        pad_id: int,
        ahead: Optional[Ahead] = None,
        sampling: Optional[SamplingConfig] = None,
    ) -> None:
        self.service, self.function, self.filter, self.schedule = service, function, group_filter, schedule
        self.draw, self.score, self.n, self.pad_id = draw, score, n, pad_id
        self.ahead, self.sampling = ahead, sampling  # sampling: what a whole-batch function reads in its request
        self.pool = TrajectoryPool(function, n, max_tokens)
        self.seeds = SeedStream(seed, "train")
        # with a judge (judge_config.overlap): finished groups are judged in the scorer's judge thread while the
        # rest of the batch generates, and reach the filter when their verdicts are in
        self.defer_judging = bool(getattr(score, "judge_overlap", False))
        self.judging: List[Tuple[List[List[Trajectory]], List[List[Trajectory]], Experience, Any]] = []

    @property
    def off_policy(self) -> bool:
        """Batches may hold tokens of older policy versions (partial or asynchronous rollout)."""
        return self.schedule.parks or self.ahead is not None

    # ----- the trainer's calls -------------------------------------------------------------------------
    def next_batch(self, iteration: int) -> RolloutBatch:
        if self.ahead is None:
            produced, waited = self.produce(iteration), None
        else:
            self.ahead.fill(iteration, self.produce)
            produced, waited, waited_in_all = self.ahead.take(iteration)
        exp = self.experience(produced)
        metrics = dict(produced.metrics)
        if waited is not None:  # the batch left the queue: its clock takes the wait for it
            produced.clock.add("timing/rollout_wait", waited)
            # the share of this batch's production that ran while the trainer did something else (the trainer
            # waits for it before an earlier weight update and when it takes it)
            seconds = produced.seconds
            metrics["async/overlap_share"] = max(0.0, 1.0 - waited_in_all / seconds) if seconds > 0 else 0.0
        return RolloutBatch(exp, metrics, produced.clock)

    def settle(self) -> float:
        """Wait for the productions in flight (asynchronous rollout); returns the seconds waited."""
        return self.ahead.settle() if self.ahead is not None else 0.0

    def experience(self, produced: Produced) -> Experience:
        """The batch's rows, group by group, with the scores the groups got when they were offered."""
        prompts, labels, outputs = group_outputs(produced.groups)
        exp = build_experience(prompts, outputs, self.n, self.pad_id, labels, produced.version)
        exp.set("scores", torch.tensor([t.score for g in produced.groups for t in g], dtype=torch.float32))
        return exp

    # ----- one production -------------------------------------------------------------------------------
    def produce(self, iteration: int) -> Produced:
        """One batch with the weights the service holds now (the loop of the module docstring)."""
        started, clock = time.perf_counter(), Clock()
        pool, flt, schedule = self.pool, self.filter, self.schedule
        version = self.service.version
        draws = rounds = tokens = drawn = 0
        reward_metrics: List[Tuple[int, Dict[str, float]]] = []
        while True:
            if not schedule.holds_back(pool):
                self._offer(clock, reward_metrics)
            self._collect_judged(clock, reward_metrics, wait=False)
            if flt.satisfied() and not schedule.keeps_generating(pool):
                break
            if self.judging_may_fill(flt) and not schedule.keeps_generating(pool):
                # a round now would not run without the judge (partial rollout stops once the batch is full)
                self._collect_judged(clock, reward_metrics, wait=True)
                continue
            wanted = not flt.satisfied() and schedule.wants_prompts(pool, flt) and flt.may_draw(draws)
            if wanted and self.judging and isinstance(flt, DynamicSampling):
                self._collect_judged(clock, reward_metrics, wait=True)  # the verdicts decide whether to draw
                continue
            # groups being judged that will all be kept may fill the batch: no prompts for them
            if wanted and not self.judging_may_fill(flt):
                prompts = self.draw()
                pool.add(prompts)
                draws, drawn = draws + 1, drawn + len(prompts.input_ids)
                continue
            if not pool.unfinished():
                if self.judging:
                    self._collect_judged(clock, reward_metrics, wait=True)
                    continue
                break  # nothing grows and no draw is allowed: the filter completes the batch
            sampling = self.sampling if self.function.whole_batch else None  # None: the service's default
            tokens += pool.run_round(self.service, self.seeds, version, schedule.chunk, clock, sampling)
            rounds += 1
        pool.join_tools(version, clock)
        self._offer(clock, reward_metrics)
        self._collect_judged(clock, reward_metrics, wait=True)
        groups, metrics = flt.take(draws)
        if len(groups) < flt.want:
            raise RuntimeError(f"rollout: {len(groups)} of {flt.want} prompt groups for iteration {iteration + 1}")
        if schedule.parks:
            for traj in pool.trajectories:
                traj.age += 1
        else:
            pool.trajectories = []  # a synchronous batch leaves nothing behind
        metrics.update(average(reward_metrics))
        judged = clock.timing.get("timing/judge", 0.0)
        if self.defer_judging and judged > 0:  # the share of the judge's time the generation hid
            metrics["judge/overlap_share"] = max(0.0, 1.0 - clock.timing.get("timing/judge_wait", 0.0) / judged)
        metrics.update(self.function.metrics([t for g in groups for t in g]))
        metrics.update(schedule_metrics(schedule, pool, groups, rounds, tokens, drawn))
        if isinstance(flt, DynamicSampling) and metrics["dynamic_sampling/filled_groups"]:
            print(
                f"iteration {iteration + 1}: dynamic sampling found {int(metrics['dynamic_sampling/kept_groups'])} of "
                f"{flt.want} informative groups in {draws} draws (filter_groups_max_batches); "
                f"{int(metrics['dynamic_sampling/filled_groups'])} filtered groups fill the batch",
                flush=True,
            )
        return Produced(iteration, version, groups, metrics, clock, time.perf_counter() - started)

    def _offer(self, clock: Clock, reward_metrics: List[Tuple[int, Dict[str, float]]]) -> None:
        """Finished groups, oldest first, scored, to the filter until it is satisfied; the others go back to
        the pool (a synchronous schedule discards them at the end of the batch)."""
        if self.filter.satisfied():
            return
        finished = self.schedule.offerable(self.pool)
        if not finished:
            return
        groups = self.pool.take(finished)
        unscored = [g for g in groups if any(t.score is None for t in g)]
        if unscored and self.defer_judging:
            exp = self.rows_of(unscored)
            self.judging.append((groups, unscored, exp, self.score.submit_judge(exp)))  # type: ignore[attr-defined]
            return
        if unscored:
            rows = sum(len(g) for g in unscored)
            reward_metrics.append((rows, self.score_groups(unscored, clock)))
        self._to_filter(groups)

    def judging_may_fill(self, flt: GroupFilter) -> bool:
        """Whether the groups being judged, with the pool's and the filter's, could complete the batch. A filter
        that may drop groups (dynamic sampling) waits for every verdict: when to draw, and so which prompts share a
        round and its seeds, must not depend on how fast the judge is."""
        if not self.judging:
            return False
        if isinstance(flt, DynamicSampling):
            return True
        judged = sum(len(groups) for groups, *_ in self.judging)
        return len(self.pool.groups()) + len(flt.kept) + judged >= flt.want

    def _to_filter(self, groups: List[List[Trajectory]]) -> None:
        for k, group in enumerate(groups):
            if self.filter.satisfied():
                self.pool.put_back(groups[k:])
                break
            self.filter.offer(group)

    def _collect_judged(self, clock: Clock, reward_metrics: List[Tuple[int, Dict[str, float]]], wait: bool) -> None:
        """The groups whose verdicts are in (``wait``: all of them), oldest first, scored and to the filter."""
        while self.judging and (wait or self.judging[0][3].done()):
            groups, unscored, exp, judged = self.judging.pop(0)
            rows = sum(len(g) for g in unscored)
            reward_metrics.append((rows, self.score_groups(unscored, clock, exp, judged)))
            self._to_filter(groups)

    def rows_of(self, groups: Sequence[Sequence[Trajectory]]) -> Experience:
        prompts, labels, outputs = group_outputs(groups)
        return build_experience(prompts, outputs, self.n, self.pad_id, labels)

    def score_groups(
        self, groups: Sequence[Sequence[Trajectory]], clock: Clock, exp: Optional[Experience] = None, judged=None
    ) -> Dict[str, float]:
        """Score the groups' rows (``exp``: already built; ``judged``: the judge's verdicts asked for them)."""
        exp = exp if exp is not None else self.rows_of(groups)
        metrics, per_verifier = self.score(exp, clock, judged) if judged is not None else self.score(exp, clock)
        rows = [t for g in groups for t in g]
        scores = exp.scores
        assert scores is not None, "score() sets the experience's scores"
        for r, traj in enumerate(rows):
            traj.score = float(scores[r])
            traj.verifier_scores = {name: float(values[r]) for name, values in per_verifier.items()}
        return metrics

    # ----- validation -----------------------------------------------------------------------------------
    def evaluate(
        self, prompts: PromptBatch, n: int, seed: int, sampling: SamplingConfig
    ) -> Tuple[List[RolloutOutput], Dict[str, float]]:
        """Every prompt's n trajectories to their end with ``sampling`` (no filter, nothing parked, the
        training pool untouched): outputs numbered by prompt, and the rollout function's metrics."""
        pool = TrajectoryPool(self.function, n, sampling.max_tokens)
        pool.add(prompts)
        clock, seeds = Clock(), SeedStream(seed, "validation")  # every validation samples with the same seeds
        while pool.unfinished():
            pool.run_round(self.service, seeds, self.service.version, sampling.max_tokens, clock, sampling)
        pool.join_tools(self.service.version, clock)
        trajectories = sorted(pool.trajectories, key=lambda t: t.uid)
        pool.close()
        return [t.output(t.uid // n) for t in trajectories], self.function.metrics(trajectories)

    # ----- checkpoint -----------------------------------------------------------------------------------
    def state_dict(self) -> Dict:
        """The parked trajectories, the filter's groups and the batches produced ahead (waits for those in
        flight)."""
        produced = self.ahead.produced() if self.ahead is not None else None  # settles first
        state = {"pool": self.pool.state_dict(), "filter": self.filter.state_dict(), "seeds_used": self.seeds.used}
        if produced is not None:
            state["ahead"] = [p.state() for p in produced]
        return state

    def load_state_dict(self, trainer_state: Dict) -> None:
        """From a trainer state: this source's own (``rollout_source``), or the partial-rollout pool and the
        asynchronous batches of a checkpoint written before batches came from a source."""
        state = trainer_state.get("rollout_source")
        if state is not None:
            self.pool.load_state_dict(state["pool"])
            self.filter.load_state_dict(state.get("filter", {}))
            self.seeds.used = int(state.get("seeds_used", 0))
            produced = [Produced.from_state(p) for p in state.get("ahead", [])]
        else:
            legacy = trainer_state.get("partial_rollout")
            if legacy:
                self.pool.load_state_dict(
                    {"n": legacy["n"], "next_uid": legacy["next_uid"],
                     "trajectories": [from_partial_pool(t).state() for t in legacy["pool"]]}
                )  # fmt: skip
            produced = [legacy_async_batch(b, self.n) for b in trainer_state.get("async_rollout") or []]
        if produced and self.ahead is None:
            raise ConfigError(
                "rl_config.max_head_offpolicyness",
                f"0, but the checkpoint holds {len(produced)} batch(es) produced ahead: resume with the run's "
                "max_head_offpolicyness (and its rollout_resource)",
            )
        for batch in produced:  # batches of an older checkpoint kept no scores: score them now, on this thread
            unscored = [g for g in batch.groups if any(t.score is None for t in g)]
            if unscored:
                batch.metrics.update(self.score_groups(unscored, batch.clock))
        if self.ahead is not None:
            self.ahead.restore(produced)

    def close(self) -> None:
        self.pool.close()
        self.function.close()

    # ----- from the config ------------------------------------------------------------------------------
    @staticmethod
    def from_config(cfg, service, dataset, sampler, tokenizer, score: Score) -> "RolloutSource":
        from ..config_cls.feature_rules import agent_rollout_function, filter_metric_name

        rl, sampling = cfg.rl, cfg.generate.sampling_config
        function = build_rollout_function(agent_rollout_function(rl), agent_context(rl, tokenizer))
        want = cfg.prompts_per_iteration
        group_filter: GroupFilter
        schedule: Union[Synchronous, Chunked]
        if rl.filter_groups_enable:
            group_filter = DynamicSampling(want, filter_metric_name(rl), rl.filter_groups_max_batches)
        else:
            group_filter = KeepAll(want)
        if rl.partial_rollout_max_split > 1:
            schedule = Chunked(sampling.max_tokens, rl.partial_rollout_max_split, rl.require_max_age_all_finished)
        else:
            schedule = Synchronous(sampling.max_tokens)
        ahead = Ahead(rl.max_head_offpolicyness) if rl.max_head_offpolicyness > 0 else None
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

        def draw() -> PromptBatch:
            return PromptBatch.of(dataset, sampler.next_batch())

        return RolloutSource(service, function, group_filter, schedule, draw, score, rl.n_samples_per_prompt,
                             sampling.max_tokens, sampling.seed, pad_id, ahead, sampling)  # fmt: skip


def agent_context(rl, tokenizer) -> AgentContext:
    """What rollout functions use: the tokenizer and, when tools are configured, the tools, their sandbox
    (the isolation pre-flight chose) and the chat template's tool role."""
    from ..datasets.templates import load_templates
    from ..tools.isolation import choose
    from ..tools.registry import model_code_tools, resolve_tools
    from ..tools.sandbox import Sandbox, SandboxLimits

    tools = resolve_tools(rl.tools, rl.tool_config_path)
    template = load_templates().get(rl.prompt_type, {})
    sandbox = None
    if tools:  # preflight has printed the isolation's note
        isolation, _ = choose(rl.tool_isolation, model_code_tools(tools))
        limits = SandboxLimits(rl.tool_timeout, rl.tool_cpu_seconds, rl.tool_memory_mb, rl.tool_max_result_bytes,
                               scratch_mb=rl.tool_scratch_mb)  # fmt: skip
        sandbox = Sandbox(limits, isolation)
    tool_format = ToolFormat.of_template(template, rl.prompt_type) if "tool_response" in template else None
    return AgentContext(None, tokenizer, tools, sandbox, AgentSettings.of(rl), tool_format)


COUNTS = (  # summed, not averaged
    "rule_reward/timeouts",
    "rule_reward/failures",
    "rollout/out_of_vocab_tokens",
    "judge/request_failures",
    "judge/parse_failures",
)


def average(weighted: Sequence[Tuple[int, Dict[str, float]]]) -> Dict[str, float]:
    """Metrics of several scoring calls: counts (``COUNTS``) summed, the others weighted by the calls' rows."""
    total: Dict[str, float] = {}
    rows: Dict[str, int] = {}
    for count, metrics in weighted:
        for key, value in metrics.items():
            total[key] = total.get(key, 0.0) + (value if key in COUNTS else value * count)
            rows[key] = rows.get(key, 0) + count
    return {key: total[key] if key in COUNTS else total[key] / rows[key] for key in total}


def legacy_async_batch(item: Dict, n: int) -> Produced:
    """A batch of ``trainer_state.async_rollout`` (written before batches came from a source)."""
    prompts = PromptBatch(**item["prompts"])
    version = int(item["version"])
    grouped = by_prompt(RolloutOutput(**out) for out in item["outputs"])
    groups = []
    for i, prompt in enumerate(prompts.input_ids):
        group = []
        for k, out in enumerate(grouped.get(i, [])):
            ids = list(out.response_ids)
            traj = Trajectory(i * n + k, list(prompt), prompts.labels[i], max(1, len(ids)), tokens=ids,
                              logprobs=list(out.logprobs), loss_mask=list(out.loss_mask or [1] * len(ids)),
                              versions=list(out.versions or [version] * len(ids)))  # fmt: skip
            traj.end_with(out.finish_reason)
            group.append(traj)
        groups.append(group)
    clock = Clock()
    clock.timing.update(item.get("timing", {}))
    return Produced(int(item["iteration"]), version, groups, {}, clock)
