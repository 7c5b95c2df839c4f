"""An HTTP answer read within bounds, for the judge's client: at most ``cap`` bytes of its body as decoded, and the
body read before a wall-clock deadline.

A body sent with ``Content-Encoding: gzip`` or ``deflate`` is inflated here, at most ``INFLATE_STEP`` bytes a step,
and the cap counts what comes out: a small compressed body cannot inflate past the cap in memory (200 MB of zeros
gzip to 200 KB). The deadline is checked between chunks, so a server sending a byte now and then, which no socket
timeout catches, cannot hold a request past it either."""

from __future__ import annotations

import time
import zlib
from typing import Any, Iterator, List, Optional

INFLATE_STEP = 64 << 10  # the most bytes one inflate step produces
INFLATED_HERE = ("gzip", "x-gzip", "deflate")  # the codings asked for and decoded (bounded) here


class ResponseTooLarge(Exception):
    """The endpoint sent more than the judge reads of one answer."""


def too_large(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from: the client wraps transport errors) is ResponseTooLarge."""
    seen: Optional[BaseException] = exc
    for _ in range(8):
        if seen is None or isinstance(seen, ResponseTooLarge):
            return seen is not None
        seen = seen.__cause__ or seen.__context__
    return False


class MalformedBody(Exception):
    """A body that does not inflate (a failed request, as a malformed JSON body is)."""


class Inflater:
    """One content coding undone a bounded step at a time: gzip, or deflate (zlib-wrapped, or raw as some servers
    send it: tried when the zlib header is wrong, as httpx does)."""

    def __init__(self, coding: str):
        self.coding = coding
        self.inflater = zlib.decompressobj(zlib.MAX_WBITS | 16 if "gzip" in coding else zlib.MAX_WBITS)
        self.started = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """What ``data`` inflates to, in pieces of at most INFLATE_STEP bytes (the input left over kept for the
        next step, not inflated at once)."""
        while data and not self.inflater.eof:
            try:
                out = self.inflater.decompress(data, INFLATE_STEP)
            except zlib.error as exc:
                if self.coding == "deflate" and not self.started:
                    self.inflater, self.started = zlib.decompressobj(-zlib.MAX_WBITS), True
                    continue
                raise MalformedBody(f"a malformed {self.coding} body: {exc}") from None
            self.started = True
            data = self.inflater.unconsumed_tail
            if out:
                yield out

    def rest(self) -> bytes:
        """What is left inside the inflater once the body ended (at most a few hundred bytes: its input is used)."""
        return self.inflater.flush(INFLATE_STEP)


def codings(header: str) -> List[str]:
    """The content codings of a Content-Encoding header, in the order they were applied (identity left out)."""
    return [c.strip().lower() for c in header.split(",") if c.strip() and c.strip().lower() != "identity"]


def decoded(data: bytes, inflaters: List[Inflater]) -> Iterator[bytes]:
    """``data`` through each of ``inflaters`` in turn, in bounded pieces."""
    if not inflaters:
        yield data
        return
    for piece in inflaters[0].pieces(data):
        yield from decoded(piece, inflaters[1:])


def bounded_transport(cap: int, seconds: float, until: Optional[float] = None) -> Any:
    """An httpx transport whose response bodies raise ResponseTooLarge once more than ``cap`` bytes arrived or
    came out of their decoding (a declared Content-Length over the cap before any byte is read), and
    httpx.ReadTimeout once ``seconds`` passed since the request was sent or the monotonic time ``until`` came."""
    import httpx

    class BoundedStream(httpx.AsyncByteStream):
        def __init__(self, inner: Any, applied: List[str], deadline: float):
            self.inner, self.deadline = inner, deadline
            self.inflaters = [Inflater(c) for c in reversed(applied)]

        def counted(self, pieces: Iterator[bytes], total: List[int]) -> Iterator[bytes]:
            """``pieces``, their bytes added to ``total[0]``, stopped at the cap or the deadline."""
            self.check_time()
            for piece in pieces:
                total[0] += len(piece)
                if total[0] > cap:
                    raise ResponseTooLarge(f"more than {cap} bytes (decoded)")
                self.check_time()
                yield piece

        def check_time(self) -> None:
            if time.monotonic() > self.deadline:
                raise httpx.ReadTimeout(f"the answer took longer than {seconds} s")

        async def __aiter__(self):
            arrived, out = 0, [0]
            async for chunk in self.inner:
                arrived += len(chunk)
                if arrived > cap:
                    raise ResponseTooLarge(f"more than {cap} bytes")
                for piece in self.counted(decoded(chunk, self.inflaters), out):
                    yield piece
            for piece in self.counted(self.leftovers(), out):
                yield piece

        def leftovers(self) -> Iterator[bytes]:
            for i, inflater in enumerate(self.inflaters):
                yield from decoded(inflater.rest(), self.inflaters[i + 1 :])

        async def aclose(self) -> None:
            await self.inner.aclose()

    class BoundedTransport(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: Any) -> Any:
            deadline = time.monotonic() + seconds if until is None else min(until, time.monotonic() + seconds)
            request.headers["Accept-Encoding"] = "gzip, deflate"
            response = await super().handle_async_request(request)
            if int(response.headers.get("content-length") or 0) > cap:
                await response.aclose()
                raise ResponseTooLarge(f"Content-Length over {cap} bytes")
            applied = codings(response.headers.get("content-encoding", ""))
            unknown = [c for c in applied if c not in INFLATED_HERE]
            if unknown:  # not asked for, and not inflatable within the cap here
                await response.aclose()
                raise httpx.DecodingError(f"a body in {', '.join(unknown)}, which was not asked for")
            stale = (b"content-encoding", b"content-length")  # of the body as sent, not as decoded
            kept = [(k, v) for k, v in response.headers.raw if k.lower() not in stale]
            return httpx.Response(
                response.status_code,
                headers=kept if applied else response.headers,
                stream=BoundedStream(response.stream, applied, deadline),
                extensions=response.extensions,
                request=request,
            )

    return BoundedTransport()
