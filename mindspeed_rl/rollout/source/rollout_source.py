"""The rollout source: where the trainer gets each iteration's scored batch, and the state a resume needs.

It stacks four layers, each one class to swap (docs/rollout.md):

    rollout function   how one trajectory advances: single turn, the tool agent, a user's (agent_loop.py)
    scoring stage      when finished groups get their scores: at once, or the judge's part overlapped with
                       generation (scoring_stage.py)
    group filter       which finished prompt groups a batch keeps: all, or dynamic sampling (group_filter.py)
    schedule           when trajectories generate: synchronous or partial chunks, in step with training or
                       ahead by L versions (schedules.py)

One production (one batch) runs the loop: offer every finished group to the filter (scored first);
stop once the filter is satisfied and the schedule wants nothing more generated; else draw a global batch
of prompts when the schedule wants more growing and the filter may still draw; else run a round
(rounds.py). Groups still being scored count as offered where they could complete the batch, and a filter
that drops groups waits for every score before it draws. Every combination of the layers runs this loop.

    source = RolloutSource.from_config(cfg, service, dataset, sampler, tokenizer, score)
    batch = source.next_batch(iteration)      # .experience (scored), .metrics, .clock
    source.settle(clock)                      # before the actor's weights change
    state = source.state_dict()               # parked trajectories, batches produced ahead, the filter
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ...config_cls.generate_config import SamplingConfig
from ...datasets.prompt_dataset import PromptBatch, draw_prompts
from ...datasets.templates import ToolFormat
from ...protocol import Experience, RolloutOutput, build_experience
from ...utils.clock import Clock
from .agent_loop import AgentContext, RolloutFunction, build_rollout_function
from .group_filter import DynamicSampling, GroupFilter, KeepAll
from .legacy_state import legacy_source_state
from .production import EngineMeter, Produced, RolloutBatch, SeedStream, average
from .rounds import TrajectoryPool
from .schedules import BatchSchedule, RoundSchedule, batch_schedule, round_schedule
from .scoring_stage import RewardMetrics, Score, scoring_stage, unscored
from .staleness import StalenessBound
from .trajectory import Trajectory, group_outputs

if TYPE_CHECKING:
    from ..service import RolloutService


class RolloutSource:
    def __init__(
        self,
        service: RolloutService,
        function: RolloutFunction,
        group_filter: GroupFilter,
        schedule: RoundSchedule,
        draw: Callable[[], PromptBatch],
        score: Score,
        n: int,
        max_tokens: int,
        seed: int,
        pad_id: int,
        ahead: Optional[BatchSchedule] = None,
        sampling: Optional[SamplingConfig] = None,
        overlap_judge: bool = False,
        vision: bool = False,
        staleness: Optional[StalenessBound] = None,
    ) -> None:
        self.service, self.function, self.filter, self.schedule = service, function, group_filter, schedule
        self.draw, self.n, self.pad_id = draw, n, pad_id
        self.ahead = ahead if ahead is not None else batch_schedule(0)
        self.sampling = sampling  # what a whole-batch function reads in its request
        self.vision = vision  # a vision-language model: the rows carry their prompts' stored images
        self.pool = TrajectoryPool(function, n, max_tokens)
        self.pool.meter = self.meter = EngineMeter()
        self.seeds = SeedStream(seed, "train")
        self.scoring = scoring_stage(score, self.rows_of, overlap_judge)
        self.staleness = staleness if staleness is not None else StalenessBound()
        self.dropped_groups = 0  # since the last batch: groups with a trajectory the rollout function gave up

    @property
    def off_policy(self) -> bool:
        """Batches may hold tokens of older policy versions (partial or asynchronous rollout)."""
        return self.schedule.parks or self.ahead.lag > 0

    # ----- the trainer's calls -------------------------------------------------------------------------
    def next_batch(self, iteration: int) -> RolloutBatch:
        self.ahead.fill(iteration, self.produce)
        produced, metrics = self.ahead.take(iteration)
        idle = self.meter.idle_share()  # since the previous batch was taken
        if idle is not None:
            metrics["timing/engine_idle_share"] = idle
        return RolloutBatch(self.experience(produced), {**produced.metrics, **metrics}, produced.clock)

    def settle(self, clock: Optional[Clock] = None) -> float:
        """Wait for the productions in flight (asynchronous rollout; the wait goes on ``clock``)."""
        return self.ahead.settle(clock)

    def experience(self, produced: Produced) -> Experience:
        """The batch's rows: each group's rows as they were scored, numbered group by group."""
        exp = Experience.cat([self.group_rows(g) for g in produced.groups], self.pad_id)
        exp.set("group", torch.arange(exp.num_rows) // self.n)
        return exp

    def group_rows(self, group: Sequence[Trajectory]) -> Experience:
        """The rows ``group`` was scored on; for a group restored from a checkpoint (rows are not saved), its
        rows rebuilt with the scores it got."""
        kept = group[0].group_rows
        if kept is not None and kept.uids == [t.uid for t in group]:
            return kept.rows
        rows = self.rows_of([group])
        rows.set("scores", torch.tensor([t.score for t in group], dtype=torch.float32))
        return rows

    # ----- one production -------------------------------------------------------------------------------
    def produce(self, iteration: int) -> Produced:
        """One batch with the weights the service holds now (the loop of the module docstring)."""
        started, clock = time.perf_counter(), Clock()
        pool, flt, schedule, scoring = self.pool, self.filter, self.schedule, self.scoring
        version = self.service.version
        draws = rounds = tokens = drawn = skipped = 0
        scored: RewardMetrics = []
        while True:
            if not schedule.holds_back(pool):
                self._offer(clock, scored, iteration)
            self._to_filter(scoring.ready(clock, scored, wait=False))
            if flt.satisfied() and not schedule.keeps_generating(pool):
                break
            wanted = not flt.satisfied() and schedule.wants_prompts(pool, flt) and flt.may_draw(draws)
            may_fill = self.scores_may_fill()
            if may_fill and (not schedule.keeps_generating(pool) or (wanted and flt.drops)):
                # the groups being scored decide whether a round is needed at all (partial rollout stops once the
                # batch is full), or whether to draw (a filter that drops groups)
                self._to_filter(scoring.ready(clock, scored, wait=True))
                continue
            if wanted and not may_fill:  # groups being scored that could fill the batch want no prompts
                prompts = self.draw()
                pool.add(prompts)
                draws, drawn, skipped = draws + 1, drawn + len(prompts.input_ids), skipped + prompts.skipped
                continue
            if not pool.unfinished():
                if scoring.pending:
                    self._to_filter(scoring.ready(clock, scored, wait=True))
                    continue
                break  # nothing grows and no draw is allowed: the filter completes the batch
            sampling = self.sampling if self.function.whole_batch else None  # None: the service's default
            tokens += pool.run_round(self.service, self.seeds, version, schedule.chunk, clock, sampling)
            rounds += 1
        pool.join_tools(version, clock)
        self._offer(clock, scored, iteration)
        self._to_filter(scoring.ready(clock, scored, wait=True))
        groups, metrics = flt.take(draws)
        if len(groups) < flt.want:
            raise RuntimeError(f"rollout: {len(groups)} of {flt.want} prompt groups for iteration {iteration + 1}")
        schedule.leave(pool)
        metrics.update(average(scored))
        metrics.update(scoring.metrics(clock))
        metrics.update(self.function.metrics([t for g in groups for t in g]))
        metrics.update(schedule.metrics(pool, groups, rounds, tokens, drawn))
        metrics.update(self.staleness.metrics())
        if self.dropped_groups:
            metrics["rollout/dropped_groups"], self.dropped_groups = float(self.dropped_groups), 0
        if self.vision:  # rows of a vision dataset whose stored images do not decode
            metrics["rollout/skipped_prompts"] = float(skipped)
        line = flt.summary(iteration, metrics, draws)
        if line:
            print(line, flush=True)
        return Produced(iteration, version, groups, metrics, clock, time.perf_counter() - started)

    def _offer(self, clock: Clock, scored: RewardMetrics, iteration: int) -> None:
        """Finished groups, oldest first, to the scoring stage and, once scored, to the filter until it is
        satisfied; the others go back to the pool (a synchronous schedule discards them at the end of the batch).
        Stale groups (the batch trains at version ``iteration``) are dropped or go back to generate again."""
        if self.filter.satisfied():
            return
        finished = self.schedule.offerable(self.pool)
        if finished:
            taken = self.pool.take(finished)
            kept = [g for g in taken if not any(t.dropped for t in g)]
            self.dropped_groups += len(taken) - len(kept)  # an episode given up: the group is left out, counted
            fresh, again = self.staleness.screen(kept, iteration)
            if again:
                self.pool.put_back(again, restarted=True)
            if fresh:
                self._to_filter(self.scoring.submit(fresh, clock, scored))

    def scores_may_fill(self) -> bool:
        """Whether groups still being scored, with the pool's and the filter's, could complete the batch. A filter
        that may drop groups waits for every score: when to draw, and so which prompts share a round and its
        seeds, must not depend on how fast the scoring is."""
        pending = self.scoring.pending
        if not pending:
            return False
        return self.filter.drops or len(self.pool.groups()) + len(self.filter.kept) + pending >= self.filter.want

    def _to_filter(self, groups: List[List[Trajectory]]) -> None:
        for k, group in enumerate(groups):
            if self.filter.satisfied():
                self.pool.put_back(groups[k:])
                break
            self.filter.offer(group)

    def rows_of(self, groups: Sequence[Sequence[Trajectory]]) -> Experience:
        prompts, labels, outputs = group_outputs(groups)
        rows = build_experience(prompts, outputs, self.n, self.pad_id, labels, images=self.stored_images(groups))
        if self.function.rewards_episodes:  # an outside agent's (openai_agent; NaN: none): the scorer adds them
            rewards = [float("nan") if t.reward is None else t.reward for g in groups for t in g]
            rows.set("episode_rewards", torch.tensor(rewards))
        return rows

    def stored_images(self, groups: Sequence[Sequence[Trajectory]]) -> Optional[List[bytes]]:
        """Each group's prompt images as stored (None: a text model or no images): the workers that run the model
        decode them, so they cross Ray once per prompt as bytes, not as pixels per row."""
        if not self.vision or not any(g[0].images for g in groups):
            return None
        return [g[0].images for g in groups]

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
        produced = self.ahead.produced()  # first: no production may change the pool, the filter or the seeds after
        state = {"pool": self.pool.state_dict(), "filter": self.filter.state_dict(), "seeds_used": self.seeds.used}
        if produced:
            state["ahead"] = [p.state() for p in produced]
        return state

    def load_state_dict(self, trainer_state: Dict) -> None:
        """From a trainer state: this source's own (``rollout_source``), or what an older checkpoint kept
        (legacy_state.py)."""
        state = trainer_state.get("rollout_source")
        if state is not None:
            pool: Optional[Dict] = state["pool"]
            self.filter.load_state_dict(state.get("filter", {}))
            self.seeds.used = int(state.get("seeds_used", 0))
            produced = [Produced.from_state(p) for p in state.get("ahead", [])]
        else:
            pool, produced = legacy_source_state(trainer_state, self.n)
        if pool is not None:
            self.pool.load_state_dict(pool)
        for batch in produced:  # batches of an older checkpoint kept no scores: score them now, on this thread
            todo = unscored(batch.groups)
            if todo:
                batch.metrics.update(self.scoring.score_now(todo, batch.clock))
        self.ahead.restore(produced)

    def close(self) -> None:
        self.ahead.close()
        self.pool.close()
        self.function.close()

    # ----- from the config ------------------------------------------------------------------------------
    @staticmethod
    def from_config(cfg, service, dataset, sampler, tokenizer, score: Score, run_dir: str = "") -> "RolloutSource":
        from ...features.agent import agent_rollout_function
        from ...features.dynamic_sampling import filter_metric_name

        rl, sampling = cfg.rl, cfg.generate.sampling_config
        context = agent_context(rl, tokenizer, cfg.generate.max_model_len, run_dir)
        function = build_rollout_function(agent_rollout_function(rl), context)
        want = cfg.prompts_per_iteration
        group_filter: GroupFilter
        if rl.filter_groups_enable:
            group_filter = DynamicSampling(want, filter_metric_name(rl), rl.filter_groups_max_batches)
        else:
            group_filter = KeepAll(want)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

        def draw() -> PromptBatch:
            return draw_prompts(dataset, sampler)

        overlap = cfg.judge is not None and cfg.judge.overlap
        keys = rl.async_training
        return RolloutSource(
            service,
            function,
            group_filter,
            round_schedule(rl, sampling.max_tokens),
            draw,
            score,
            rl.n_samples_per_prompt,
            sampling.max_tokens,
            sampling.seed,
            pad_id,
            batch_schedule(rl.max_head_offpolicyness, keys.in_flight_weight_updates),
            sampling,
            overlap,
            bool(cfg.actor.model.vision_config),
            StalenessBound(keys.max_staleness, keys.stale_trajectories),
        )


def agent_context(rl, tokenizer, max_context: int = 0, log_dir: str = "") -> AgentContext:
    """What rollout functions use: the tokenizer and, when tools are configured, the tools, their sandbox
    (the isolation pre-flight chose) and the chat template's tool role."""
    from ...datasets.templates import load_templates
    from ...features.agent import agent_rollout_function
    from ...tools.isolation import choose
    from ...tools.registry import model_code_tools, resolve_tools
    from ...tools.sandbox import Sandbox, SandboxLimits

    tools = resolve_tools(rl.tools, rl.tool_config_path)
    template = load_templates().get(rl.prompt_type, {})
    sandbox = None
    if tools:  # preflight has printed the isolation's note
        isolation, _ = choose(rl.sandbox.isolation, model_code_tools(tools))
        box = rl.sandbox
        limits = SandboxLimits(
            timeout_s=box.timeout,
            cpu_seconds=box.cpu_seconds,
            memory_mb=box.memory_mb,
            max_result_bytes=box.max_result_bytes,
            scratch_mb=box.scratch_mb,
        )
        sandbox = Sandbox(limits, isolation)
    tool_format = ToolFormat.of_template(template, rl.prompt_type) if "tool_response" in template else None
    context = AgentContext(None, tokenizer, tools, sandbox, rl.agent, tool_format)
    if agent_rollout_function(rl) == "openai_agent":
        from .external_agent import EndpointRun

        context.endpoint = EndpointRun(rl.policy_endpoint, rl.prompt_type, rl.max_prompt_length, max_context, log_dir)
    return context
