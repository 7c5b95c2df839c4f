"""A request's body -> the turn it asks of its episode: the tokens it adds, checked against the episode so far.

Chat: the first request renders whole with the run's chat template (``prompt_type``); a later one must repeat the
conversation it continues (its messages, then one assistant message standing for the policy's answer, whatever
its text: the policy's own tokens are kept) and only the messages after that render, alone, after the answer's
end-of-turn token. Completions: ``prompt`` as text or token ids; a later one must start with everything the episode
read and wrote (as ids, or as their text), and only the rest is tokenised.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from ...datasets.chat_messages import MessageError, content_of, render_conversation, render_follow_up
from .episodes import EndpointError, Episode, Turn

OPTIONS = ("logprobs", "top_logprobs", "tools", "stream", "stream_options", "return_token_ids")


def _options(body: Mapping) -> Dict[str, Any]:
    if body.get("n") not in (None, 1):
        raise EndpointError(400, "n: one answer per request (an episode is one trajectory)")
    if body.get("stream") not in (None, True, False):
        raise EndpointError(400, "stream must be true or false")
    return {k: body[k] for k in OPTIONS if k in body}


def _same(a: Mapping, b: Mapping, k: int) -> bool:
    return a.get("role") == b.get("role") and content_of(a, k) == content_of(b, k)


def _checked(episode: Episode, tokens: List[int], first: bool) -> List[int]:
    if first and len(tokens) > episode.max_prompt:
        raise EndpointError(
            400,
            f"episode {episode.id}: a prompt of {len(tokens)} tokens, over rl_config.max_prompt_length "
            f"{episode.max_prompt}",
            "context_length_exceeded",
        )
    if not first and len(tokens) >= episode.budget:
        raise EndpointError(
            400,
            f"episode {episode.id}: {len(tokens)} tokens added, {episode.budget} left of its response budget "
            "(generate_config.sampling_config.max_tokens)",
            "context_length_exceeded",
        )
    total = len(tokens) + (0 if first else len(episode.context))
    if total + 1 > episode.max_context:
        raise EndpointError(
            400,
            f"episode {episode.id}: {total} tokens, over the context length {episode.max_context}",
            "context_length_exceeded",
        )
    return tokens


def chat_turn(episode: Episode, body: Mapping, tokenizer, prompt_type: str) -> Turn:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EndpointError(400, "messages must be a non-empty list")
    options, first = _options(body), episode.turns == 0
    try:
        for k, message in enumerate(messages):
            content_of(message, k)
        if first:
            text = render_conversation(prompt_type, messages, tokenizer.eos_token or "")
        else:
            before = episode.messages or []
            n = len(before) - 1  # the last is the policy's answer
            if len(messages) <= n or not all(_same(messages[k], before[k], k) for k in range(n)):
                raise EndpointError(
                    409,
                    f"episode {episode.id}: the messages do not continue its conversation (the first {n} "
                    "must be the previous request's, then the assistant's answer)",
                    "conflict",
                )
            if messages[n].get("role") != "assistant":
                raise EndpointError(409, f"episode {episode.id}: messages[{n}] must be the assistant's answer")
            text = render_follow_up(prompt_type, messages[n + 1 :], n + 1)
    except MessageError as exc:
        raise EndpointError(400, str(exc)) from None
    tokens = tokenizer.encode(text, add_special_tokens=False)
    return Turn("chat", _checked(episode, tokens, first), first, list(messages), options, episode.turns)


def completion_turn(episode: Episode, body: Mapping, tokenizer) -> Turn:
    prompt = body.get("prompt")
    options, first = _options(body), episode.turns == 0
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch of one
    seen: Sequence[int] = [] if first else episode.context
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = len(tokenizer)
        outside = [t for t in prompt if not 0 <= t < vocab]
        if outside:
            raise EndpointError(400, f"prompt: token id {outside[0]} outside the vocabulary of {vocab}")
        if list(prompt[: len(seen)]) != list(seen):
            raise EndpointError(409, f"episode {episode.id}: the prompt's ids do not start with the episode's so far")
        tokens = list(prompt[len(seen) :])
    elif isinstance(prompt, str) and prompt:
        # the text the harness was shown: its prompt and the answers' text (without their end-of-turn tokens, which
        # stay in the trajectory as the engine wrote them); only what it adds after that is tokenised
        said = episode.shown if not first else ""
        if not first and not episode.shown:
            said = tokenizer.decode(list(seen), skip_special_tokens=False)  # the episode began with token ids
        if not prompt.startswith(said):
            raise EndpointError(409, f"episode {episode.id}: the prompt does not start with the episode's text so far")
        tokens = tokenizer.encode(prompt[len(said) :], add_special_tokens=False)
    else:
        raise EndpointError(400, "prompt must be a non-empty string or list of token ids")
    turn = Turn("completion", _checked(episode, tokens, first), first, None, options, episode.turns)
    turn.options["text_prompt"] = prompt if isinstance(prompt, str) else None
    return turn
