"""The policy endpoint: an OpenAI-compatible HTTP server over the run's rollout engines, for outside agents.

    GET  /v1/models                       the one model served (rl_config.policy_endpoint.served_model_name)
    POST /v1/chat/completions             the next assistant turn of an episode
    POST /v1/completions                  the same with a text or token-id prompt
    POST /v1/episodes/{id}/reward         {"reward": 1.0}: the episode's reward; it ends the episode
    POST /v1/episodes/{id}/end            the harness is done with the episode (the verifiers score it)

Every route also answers under ``/episodes/{id}/v1/...``, the base URL a harness is given, so that a plain OpenAI
client names its episode without knowing it; elsewhere the episode is the header ``X-Episode-Id`` or the body's
``episode_id``. Answers have OpenAI's shape plus ``token_ids`` per choice (and ``prompt_token_ids`` with
``return_token_ids``); log-probs with ``logprobs``; ``stream`` sends the whole turn as one chunk. Sampling is the
run's (generate_config.sampling_config): a request's temperature or top_p is not applied. Errors are OpenAI's
error object with a 4xx status and a message naming the field or episode.

The server runs in a thread of the driver (uvicorn); generation happens in the rollout rounds: a request waits
for its episode's turn there (episodes.py).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .episodes import EndpointError, EpisodeBook, Reply, Turn
from .turns import chat_turn, completion_turn

KEEP_ALIVE_S = 120
MAX_CONNECTIONS = 4096  # open at once: several per episode of a batch at most (a retry beside its request)


def _error(status: int, message: str, kind: str = "invalid_request_error"):
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


class PolicyEndpoint:
    def __init__(
        self,
        book: EpisodeBook,
        tokenizer,
        prompt_type: str,
        model: str,
        api_key: str,
        max_body_bytes: int,
        tool_parser: Optional[Callable] = None,
    ) -> None:
        self.book, self.tokenizer, self.prompt_type, self.model = book, tokenizer, prompt_type, model
        self.api_key, self.max_body_bytes, self.tool_parser = api_key, max_body_bytes, tool_parser
        self.base_url = ""
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None

    # ----- serving -------------------------------------------------------------------------------------
    def start(self, host: str, port: int) -> str:
        """Serve on ``host:port`` (0: a free port) in a daemon thread; returns the base URL (``.../v1``)."""
        import uvicorn

        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        bound = sock.getsockname()[1]
        config = uvicorn.Config(  # connections beyond the limit are answered 503 at once: memory stays bounded
            self.app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            limit_concurrency=MAX_CONNECTIONS,
            # an idle connection outlives its clients' pools (httpx lets one go after 5 s): with uvicorn's 5 s, a
            # client sometimes sent a request on a connection the server was closing (ReadError, 1 in 256 episodes)
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="policy-endpoint", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            raise RuntimeError(f"the policy endpoint did not start on {host}:{bound}")
        shown = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{shown}:{bound}/v1"
        return self.base_url

    def episode_url(self, episode_id: str) -> str:
        return self.base_url[: -len("/v1")] + f"/episodes/{episode_id}/v1"

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = None

    # ----- the application -----------------------------------------------------------------------------
    def app(self):
        app = FastAPI(title="mindspeed_rl policy endpoint", docs_url=None, redoc_url=None, openapi_url=None)

        def route(handler):
            """``handler`` behind the bearer-token check, an EndpointError answered as OpenAI's error object."""

            async def endpoint(request: Request, episode: Optional[str] = None):
                try:
                    self._authorised(request)
                    return await handler(request, episode)
                except EndpointError as exc:
                    return _error(exc.status, exc.message, exc.kind)

            return endpoint

        for prefix in ("", "/episodes/{episode}"):  # the episode's own base URL serves the same routes
            app.add_api_route(prefix + "/v1/models", route(self._models), methods=["GET"])
            app.add_api_route(prefix + "/v1/chat/completions", route(self._chat), methods=["POST"])
            app.add_api_route(prefix + "/v1/completions", route(self._completions), methods=["POST"])
        for base in ("/v1/episodes/{episode}", "/episodes/{episode}/v1"):
            app.add_api_route(base + "/reward", route(self._reward), methods=["POST"])
            app.add_api_route(base + "/end", route(self._end), methods=["POST"])

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        return app

    def _authorised(self, request) -> None:
        if self.api_key and request.headers.get("authorization", "") != f"Bearer {self.api_key}":
            raise EndpointError(401, "a bearer token is required (rl_config.policy_endpoint.api_key)", "auth_error")

    async def _body(self, request, optional: bool = False) -> Dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise EndpointError(413, f"a body of {declared} bytes, over {self.max_body_bytes} (max_body_bytes)")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.max_body_bytes:
                raise EndpointError(413, f"a body over {self.max_body_bytes} bytes (max_body_bytes)")
        if optional and not raw.strip():
            return {}
        try:
            body = json.loads(bytes(raw) or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise EndpointError(400, f"the body is not JSON: {exc}") from None
        except RecursionError:
            raise EndpointError(400, "the body is JSON nested too deeply") from None
        if not isinstance(body, dict):
            raise EndpointError(400, "the body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model:
            raise EndpointError(404, f"model {model!r} is not served here; this endpoint serves {self.model!r}")
        return body

    def _episode(self, request, episode: Optional[str], body: Mapping):
        name = episode or request.headers.get("x-episode-id") or body.get("episode_id")
        if not name or not isinstance(name, str):
            raise EndpointError(400, "name the episode: base URL /episodes/{id}/v1, header X-Episode-Id or episode_id")
        return self.book.find(name)

    async def _models(self, request, episode):
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "mindspeed_rl"}]}

    async def _reward(self, request, episode):
        body = await self._body(request)
        found = self.book.find(episode)
        self.book.reward(found, body.get("reward"))
        return {"episode_id": found.id, "reward": found.reward}

    async def _end(self, request, episode):
        """The harness is done with the episode (a shared harness's exit for one episode): a reward in the body is
        posted; without one the verifiers score it (with require_reward it is dropped)."""
        body = await self._body(request, optional=True)
        found = self.book.find(episode)
        if body.get("reward") is not None:
            self.book.reward(found, body["reward"])
        else:
            self.book.harness_exited(found, None)
        return {"episode_id": found.id, "ended": True}

    async def _turn(self, request, episode, make: Callable[[Any, Mapping], Turn]):
        body = await self._body(request)
        found = self._episode(request, episode, body)
        try:
            turn = make(found, body)
        except EndpointError as exc:
            if exc.kind == "context_length_exceeded":
                self.book.out_of_budget(found)  # no later turn can fit: it ends cut, at its reward or exit
            raise
        turn.body = json.dumps(body, sort_keys=True).encode()
        reply: Reply = await asyncio.wrap_future(self.book.request(found, turn))
        answer = self._answer(turn, reply, found)
        if turn.options.get("stream"):
            options = turn.options.get("stream_options")
            return self._stream(answer, turn.kind, isinstance(options, dict) and bool(options.get("include_usage")))
        return answer

    async def _chat(self, request, episode):
        return await self._turn(request, episode, lambda e, b: chat_turn(e, b, self.tokenizer, self.prompt_type))

    async def _completions(self, request, episode):
        return await self._turn(request, episode, lambda e, b: completion_turn(e, b, self.tokenizer))

    # ----- answers -------------------------------------------------------------------------------------
    def _answer(self, turn: Turn, reply: Reply, episode) -> Dict[str, Any]:
        text = self.tokenizer.decode(reply.tokens, skip_special_tokens=True)
        shown = turn.options.get("text_prompt")
        if shown is not None:  # text completions: what the next prompt must start with
            episode.shown = shown + text
        pieces = [self.tokenizer.decode([t]) for t in reply.tokens] if turn.options.get("logprobs") else []
        choice: Dict[str, Any] = {"index": 0, "finish_reason": reply.finish_reason, "token_ids": reply.tokens}
        if turn.kind == "chat":
            message: Dict[str, Any] = {"role": "assistant", "content": text}
            calls = self._tool_calls(reply) if turn.options.get("tools") else []
            if calls:
                message["tool_calls"] = calls
                choice["finish_reason"] = "tool_calls" if reply.finish_reason == "stop" else reply.finish_reason
            choice["message"] = message
            content = [
                {"token": p, "logprob": lp, "bytes": None, "top_logprobs": []} for p, lp in zip(pieces, reply.logprobs)
            ]
            choice["logprobs"] = {"content": content} if pieces else None
        else:
            choice["text"] = text
            offsets = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
            choice["logprobs"] = (
                {"tokens": pieces, "token_logprobs": reply.logprobs, "top_logprobs": None, "text_offset": offsets}
                if pieces
                else None
            )
        answer = {
            "id": f"{'chatcmpl' if turn.kind == 'chat' else 'cmpl'}-{episode.id}-{turn.after_turns + 1}",
            "object": "chat.completion" if turn.kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": len(reply.tokens),
                "total_tokens": reply.prompt_tokens + len(reply.tokens),
            },
            "episode_id": episode.id,
            "policy_versions": sorted(set(reply.versions)),
        }
        if turn.options.get("return_token_ids"):  # the whole context the engine read, as vLLM gives it
            answer["prompt_token_ids"] = list(episode.context[: reply.prompt_tokens])
        return answer

    def _tool_calls(self, reply: Reply):
        if self.tool_parser is None:
            return []
        parsed = self.tool_parser(self.tokenizer.decode(reply.tokens, skip_special_tokens=False))
        return [
            {"id": f"call_{k}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for k, c in enumerate(parsed.calls)
        ]

    @staticmethod
    def _stream(answer: Dict[str, Any], kind: str, usage: bool):
        """The whole turn as one chunk, then the finish, then [DONE] (server-sent events); the usage in a last chunk
        of no choices when ``stream_options.include_usage`` asks for it, as OpenAI sends it."""
        choice = dict(answer["choices"][0])
        finish = choice.pop("finish_reason")
        head = {k: v for k, v in answer.items() if k != "usage"}
        head["object"] = "chat.completion.chunk" if kind == "chat" else "text_completion"
        if kind == "chat":
            delta = dict(choice.pop("message"))
            if "tool_calls" in delta:  # a streamed call carries its position
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(delta["tool_calls"])]
            choice["delta"] = delta
        last_choice: Dict[str, Any] = {"index": 0, "finish_reason": finish}
        if kind == "chat":
            last_choice["delta"] = {}
        else:
            last_choice["text"] = ""
        events = [{**head, "choices": [{**choice, "finish_reason": None}]}, {**head, "choices": [last_choice]}]
        if usage:
            events.append({**head, "choices": [], "usage": answer["usage"]})

        def stream():
            for event in events:
                yield f"data: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")
