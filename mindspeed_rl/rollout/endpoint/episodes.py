"""Episodes: what the policy endpoint and the rollout function share about each outside agent's conversation.

An episode is one trajectory of the batch, driven by a harness (rollout/endpoint/harness.py) through the endpoint
(rollout/endpoint/server.py). Its life, with the two sides it is shared by:

    endpoint (HTTP threads)                         rollout function (the pool's tool thread, rounds)
    request(id, turn) -> Future of the answer       wait(id, deadline) -> the turn asked for, or the end
                                                    [the trajectory generates the turn: rounds, chunks, versions]
    the Future resolves  <------------------------  answer(id, reply)
    reward(id, value) / the harness exits  ------>  wait(...) -> Ended(reward) or Dropped(reason)

At most one request of an episode is in flight: another one meanwhile is refused (409), so a flooding harness costs
nothing. The conversation is kept as the tokens the engine read and wrote (``Turn.tokens``: the whole prompt for
the first request, afterwards only what the harness added after the policy's last answer), so nothing the policy
sampled is ever re-tokenised. An episode the book has forgotten answers 404; its tokens live in the trajectory.
"""

from __future__ import annotations

import math
import numbers
import secrets
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Union

OPEN, CLOSING, ENDED = "open", "closing", "ended"  # closing: no more turns (budget or turns spent), a reward may come


class EndpointError(Exception):
    """An HTTP error for the caller: status and a message that names the episode or field."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass
class Turn:
    """A request the harness made: the tokens it adds and how it wants the answer."""

    kind: str  # "chat" or "completion"
    tokens: List[int]  # first turn: the whole prompt; later: the harness's text after the policy's last answer
    first: bool
    messages: Optional[List[Dict[str, Any]]] = None  # chat: the request's messages (the next must continue them)
    options: Dict[str, Any] = field(default_factory=dict)  # logprobs, tools, stream...
    after_turns: int = 0  # the episode's answered turns when the request was read (one read before a later answer
    # is stale: refused)
    body: bytes = b""  # the request as sent: a client's retry of the request in flight joins it
    answer: "Future[Reply]" = field(default_factory=Future)


@dataclass
class Reply:
    """The policy's answer to a turn."""

    tokens: List[int]
    logprobs: List[float]
    finish_reason: str  # "stop" or "length"
    versions: List[int]
    prompt_tokens: int  # tokens of the context the engine read for it


@dataclass
class Ended:
    reward: Optional[float]
    cut: bool = False  # the token budget ended it (the turn limit does not cut: the episode finished its turns)


@dataclass
class Dropped:
    reason: str


Next = Union[Turn, Ended, Dropped]


@dataclass
class Episode:
    id: str
    uid: int  # its trajectory's
    budget: int  # response tokens the trajectory may still hold (generated and the harness's)
    max_prompt: int
    max_context: int
    context: List[int] = field(default_factory=list)  # every token the engine has read or written so far
    messages: Optional[List[Dict[str, Any]]] = None  # the conversation the last chat request and its answer form
    state: str = OPEN
    waiting: Optional[Turn] = None  # asked for, not yet taken by the rollout function
    generating: Optional[Turn] = None  # taken, its answer not sent
    end: Optional[Next] = None
    reward: Optional[float] = None
    turns: int = 0
    shown: str = ""  # text completions: the prompt text and the answers' text as the harness was shown them
    budget_spent: bool = False  # closing because no token is left (or the harness's next message would not fit)
    started: float = field(default_factory=time.monotonic)


class EpisodeBook:
    """The episodes in flight, thread-safe. ``forget`` removes one; its id is remembered (bounded) for the 404's
    message."""

    def __init__(self, require_reward: bool) -> None:
        self.require_reward = require_reward
        self._episodes: Dict[str, Episode] = {}
        self._gone: Deque[str] = deque(maxlen=4096)
        self._changed = threading.Condition()
        self.counts = {"started": 0, "finished": 0, "dropped": 0}
        self.drop_reasons: Dict[str, int] = {}  # since the last take_counts

    # ----- the rollout function's side -----------------------------------------------------------------
    def open(self, uid: int, budget: int, max_prompt: int, max_context: int) -> Episode:
        episode = Episode(f"ep-{uid}-{secrets.token_hex(4)}", uid, budget, max_prompt, max_context)
        with self._changed:
            self._episodes[episode.id] = episode
            self.counts["started"] += 1
        return episode

    def wait(self, episode: Episode, deadline: float, timeout_s: float) -> Next:
        """The episode's next turn, or its end; Dropped at ``deadline`` (time.monotonic(); ``timeout_s`` after
        the batch's harnesses were started or answered, so silent ones do not add up) without either."""
        with self._changed:
            while episode.waiting is None and episode.end is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._finish(episode, Dropped(f"no request, reward or exit within {timeout_s:g} s"))
                    break
                self._changed.wait(left)
            if episode.waiting is not None and episode.end is None:
                turn, episode.waiting = episode.waiting, None
                episode.generating = turn
                if turn.first:
                    episode.context = list(turn.tokens)
                else:
                    episode.context += turn.tokens
                    episode.budget -= len(turn.tokens)
                return turn
            assert episode.end is not None
            return episode.end

    def answer(self, episode: Episode, reply: Reply, closing: str) -> None:
        """Send the policy's answer to the turn in generation; ``closing`` ("budget" or "turns"): no turn may
        follow, only the reward or the harness's exit."""
        with self._changed:
            turn, episode.generating = episode.generating, None
            episode.context += reply.tokens
            episode.budget -= len(reply.tokens)
            episode.turns += 1
            if closing and episode.state == OPEN:
                episode.state, episode.budget_spent = CLOSING, closing == "budget"
            if turn is not None and turn.kind == "chat" and turn.messages is not None:
                episode.messages = list(turn.messages) + [{"role": "assistant"}]
        if turn is not None and not turn.answer.done():
            turn.answer.set_result(reply)

    def out_of_budget(self, episode: Episode) -> None:
        """The harness's next message does not fit what is left of the budget: the episode takes no more turns
        and ends cut at its reward or exit, as a trajectory cut at its budget does."""
        with self._changed:
            if episode.state == OPEN and episode.turns:
                episode.state, episode.budget_spent = CLOSING, True

    def forget(self, episode: Episode) -> None:
        with self._changed:
            self._episodes.pop(episode.id, None)
            self._gone.append(episode.id)

    def active(self) -> List[Episode]:
        with self._changed:
            return list(self._episodes.values())

    # ----- the endpoint's and the harness's side -------------------------------------------------------
    def find(self, episode_id: str) -> Episode:
        with self._changed:
            episode = self._episodes.get(episode_id)
        if episode is None:
            known = episode_id in self._gone
            raise EndpointError(404, f"episode {episode_id!r} is {'finished' if known else 'unknown'}", "not_found")
        return episode

    def request(self, episode: Episode, turn: Turn) -> "Future[Reply]":
        """Queue ``turn`` for the rollout function; its answer comes through the returned Future."""
        with self._changed:
            if episode.state != OPEN:
                what = "has ended" if episode.state == ENDED else "has no turn left (token budget or max_turns)"
                raise EndpointError(409, f"episode {episode.id} {what}: post its reward or exit", "conflict")
            in_flight = episode.waiting or episode.generating
            if in_flight is not None:
                if turn.body and turn.body == in_flight.body:  # the client's retry: the same answer
                    return in_flight.answer
                raise EndpointError(409, f"episode {episode.id} has a request in flight: one at a time", "conflict")
            if turn.after_turns != episode.turns:
                raise EndpointError(
                    409, f"episode {episode.id} answered a turn while this request was read: send it again", "conflict"
                )
            episode.waiting = turn
            self._changed.notify_all()
        return turn.answer

    def reward(self, episode: Episode, value: Any) -> None:
        number = isinstance(value, numbers.Real) or (hasattr(value, "__float__") and not isinstance(value, str))
        if isinstance(value, bool) or not number or not math.isfinite(float(value)):
            raise EndpointError(400, f"episode {episode.id}: reward must be a finite number, got {value!r}")
        value = float(value)
        with self._changed:
            if episode.state == ENDED:
                raise EndpointError(409, f"episode {episode.id} has ended: its reward is already settled", "conflict")
            episode.reward = float(value)
            self._finish(episode, Ended(episode.reward, cut=episode.budget_spent))

    def harness_exited(self, episode: Episode, error: Optional[str]) -> None:
        """The harness of ``episode`` returned or exited (``error``: why it failed)."""
        with self._changed:
            if episode.state == ENDED:
                return
            if error is not None:
                self._finish(episode, Dropped(f"the harness failed: {error}"))
            elif self.require_reward and episode.reward is None:
                self._finish(episode, Dropped("the harness ended without a reward (require_reward)"))
            else:
                self._finish(episode, Ended(episode.reward, cut=episode.budget_spent))

    def _finish(self, episode: Episode, end: Next) -> None:
        """End ``episode`` (caller holds the lock); a request in flight is answered with an error."""
        if isinstance(end, Ended) and episode.turns == 0:  # nothing generated: no trajectory to train on
            end = Dropped("the harness ended before its first request")
        episode.state, episode.end = ENDED, end
        kind = "dropped" if isinstance(end, Dropped) else "finished"
        self.counts[kind] += 1
        if isinstance(end, Dropped):
            self.drop_reasons[end.reason[:160]] = self.drop_reasons.get(end.reason[:160], 0) + 1
        for turn in (episode.waiting, episode.generating):
            if turn is not None and not turn.answer.done():
                turn.answer.set_exception(EndpointError(409, f"episode {episode.id} has ended", "conflict"))
        episode.waiting = episode.generating = None
        self._changed.notify_all()

    def close(self) -> None:
        """The run is closing: every episode ends (dropped), its requests answered 409, its waits woken."""
        with self._changed:
            for episode in list(self._episodes.values()):
                if episode.state != ENDED:
                    self._finish(episode, Dropped("the run is closing"))

    def take_counts(self) -> "tuple[Dict[str, int], Dict[str, int]]":
        """Episodes started, finished and dropped since the last call, and why those were dropped."""
        with self._changed:
            counts, reasons = dict(self.counts), self.drop_reasons
            self.counts, self.drop_reasons = {k: 0 for k in self.counts}, {}
        return counts, reasons
