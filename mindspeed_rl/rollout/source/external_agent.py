"""The ``openai_agent`` rollout function: each trajectory is an episode of an outside agent (a harness) that talks to
the policy through the run's OpenAI-compatible endpoint (rollout/endpoint/server.py).

For one trajectory:
1. ``open``: its episode is registered and its harness started with the task (the prompt as messages, as text and
   as ids, the label); the trajectory waits (as for a tool) until the harness's first request: its rendering
   becomes the trajectory's prompt;
2. the trajectory generates the turn in the rounds like any other (whole, or in chunks under partial rollout,
   across a weight update with each token's version kept); ``absorb`` hands the turn to the waiting request;
3. the harness's next request adds its messages (tool results, the environment's turn): only they are tokenised,
   appended with loss_mask 0; or the episode ends: a reward posted (or returned by an entry point), the harness's
   exit (the verifiers score it; with ``require_reward`` it is dropped), a failure or silence past
   ``harness_timeout_s`` (dropped). A turn that spends the token budget or ``rl_config.agent.max_turns`` is the
   last: later requests are refused until the reward or the exit.
A prompt group with a dropped episode is left out of the batch and counted (rollout/dropped_groups); more
prompts are drawn in its place. An episode parked at a checkpoint starts again from its prompt on resume (its
harness's state is not the run's to save).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ...datasets.chat_messages import prompt_messages
from ...tools.parser import PARSERS
from ..endpoint.episodes import Dropped, Ended, EndpointError, Episode, EpisodeBook, Reply, Turn
from ..endpoint.harness import EpisodeTask, Harness
from ..endpoint.server import PolicyEndpoint
from .agent_loop import AgentContext, RolloutFunction
from .trajectory import CUT, FINISHED, Trajectory


@dataclass
class Start:
    episode: Episode
    task: EpisodeTask


@dataclass
class Answer:
    episode: Episode
    reply: Reply
    closing: str  # "budget" or "turns": the last turn; "" otherwise


@dataclass
class EndpointRun:
    """What the endpoint needs of the run: its keys (rl_config.policy_endpoint), the chat template, the prompt and
    context lengths, and the log folder (the harness's output)."""

    keys: Any
    prompt_type: str
    max_prompt: int
    max_context: int
    log_dir: str = ""


class OpenAIAgent(RolloutFunction):
    name = "openai_agent"
    rewards_episodes = True

    def __init__(self, context: AgentContext) -> None:
        super().__init__(context)
        run = context.endpoint
        if run is None:
            raise ValueError("the openai_agent rollout function needs rl_config.policy_endpoint")
        keys = run.keys  # rl_config.policy_endpoint
        self.run, self.keys = run, keys
        self.book = EpisodeBook(keys.require_reward)
        parser = PARSERS[context.settings.tool_parser_format]
        self.server = PolicyEndpoint(
            self.book,
            context.tokenizer,
            run.prompt_type,
            keys.served_model_name,
            keys.api_key,
            keys.max_body_bytes,
            parser,
        )
        print(f"policy endpoint: {self.server.start(keys.host, keys.port)}", flush=True)
        log = os.path.join(run.log_dir, "harness.log") if run.log_dir else None
        shared = self.server.base_url if keys.shared_harness else ""
        self.harness = Harness(keys.entry_point, keys.command, log, keys.harness_timeout_s, shared)
        self.episodes: Dict[int, Episode] = {}  # id(trajectory) -> its episode

    def open(self, traj: Trajectory) -> Start:
        if traj.tokens or traj.turns:  # restored from a checkpoint: its harness is gone, it starts again
            traj.restart()
        episode = self.book.open(traj.uid, traj.budget, self.run.max_prompt, self.run.max_context)
        self.episodes[id(traj)] = episode
        tokenizer = self.context.tokenizer
        text = tokenizer.decode(traj.prompt, skip_special_tokens=False)
        task = EpisodeTask(
            episode.id,
            self.server.episode_url(episode.id),
            self.keys.api_key or "EMPTY",
            self.keys.served_model_name,
            prompt_messages(self.run.prompt_type, text),
            text,
            list(traj.prompt),
            traj.label,
        )
        return Start(episode, task)

    def absorb(self, traj: Trajectory, out, version: int) -> Optional[Answer]:
        traj.append(out.response_ids, out.logprobs, out.versions or version, trained=True, routes=out.routed_experts)
        stopped = out.finish_reason == "stop"
        if not stopped and out.response_ids and traj.remaining() > 0:
            return None  # the chunk ended inside the turn: it continues next round
        traj.turns += 1
        start = traj.turn_start
        reply = Reply(
            traj.tokens[start:],
            traj.logprobs[start:],
            "stop" if stopped else "length",
            traj.versions[start:],
            len(traj.prompt) + start,
        )
        closing = (
            "budget" if traj.remaining() <= 0 else "turns" if traj.turns >= self.context.settings.max_turns else ""
        )
        return Answer(self.episodes[id(traj)], reply, closing)

    def run_tools(self, works: List[Any]) -> List[Any]:
        """Start the new episodes' harnesses and answer the others' requests, then wait for what each does next."""
        for work in works:
            if isinstance(work, Start):
                self.harness.start(
                    work.task,
                    functools.partial(self.book.harness_exited, work.episode),
                    functools.partial(self._returned_reward, work.episode),
                )
            else:
                self.book.answer(work.episode, work.reply, work.closing)
        timeout = self.keys.harness_timeout_s
        deadline = time.monotonic() + timeout  # one for the batch: silent harnesses do not add up
        return [self.book.wait(work.episode, deadline, timeout) for work in works]

    def _returned_reward(self, episode: Episode, value: Any) -> None:
        try:
            self.book.reward(episode, value)
        except EndpointError as exc:  # posted already, or not a number: the episode's own request said so
            self.book.harness_exited(episode, None if exc.status == 409 else exc.message)

    def observe(self, traj: Trajectory, work: Any, result: Any, version: int) -> None:
        if isinstance(result, Turn):
            if result.first:
                if traj.source_prompt is None and result.tokens != traj.prompt:
                    traj.source_prompt = traj.prompt  # the task of a restart (resume, a stale group regenerated)
                traj.prompt = list(result.tokens)
            else:
                traj.append(result.tokens, [], version, trained=False)
                traj.observation_tokens += len(result.tokens)
            traj.turn_start = len(traj.tokens)
            return
        episode = self.episodes.pop(id(traj))
        self.book.forget(episode)
        self.harness.stop(episode.id)
        if isinstance(result, Dropped):
            traj.dropped = result.reason
            traj.end(FINISHED, "stop")
            return
        assert isinstance(result, Ended)
        traj.reward = result.reward
        if result.cut:
            traj.end(CUT, "length")
        else:
            traj.end(FINISHED, "stop")

    def metrics(self, trajectories: Sequence[Trajectory]) -> Dict[str, float]:
        counts, reasons = self.book.take_counts()
        if reasons:  # the console says why (the metric only how many)
            common = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
            print(
                f"episodes: {counts['dropped']} of {counts['started']} dropped: "
                + "; ".join(f"{reason} (x{count})" for reason, count in common),
                flush=True,
            )
        n = max(1, len(trajectories))
        return {
            "episodes/started": float(counts["started"]),
            "episodes/finished": float(counts["finished"]),
            "episodes/dropped": float(counts["dropped"]),
            "episodes/turns/mean": sum(t.turns for t in trajectories) / n,
            "episodes/harness_tokens/mean": sum(t.observation_tokens for t in trajectories) / n,
        }

    def close(self) -> None:
        self.book.close()  # first: every wait and request in flight ends now
        self.harness.close()
        self.server.close()
