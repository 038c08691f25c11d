"""One HTTP/1.1 connection of the lean transport (``lean_transport.py`` has the theory of operation): an
``asyncio.Protocol`` that writes a request in one call and parses the response with httptools, stamping each
read on arrival (``stamped_socket.py``: the kernel's receive time) and handing body bytes to the request's
``StreamContext.feed``, one feed per read.

What servers and proxies send, and what this does with it:

- interim responses (``100 Continue``, ``103 Early Hints``): skipped, their headers dropped; the next response
  is the final one (RFC 9110 §15.2: "A client MUST be able to parse one or more 1xx responses received prior to
  a final response"). ``101`` is an upgrade: an error.
- a body with neither Content-Length nor chunked coding ends when the server closes the connection (RFC 9112
  §6.3, rule 8): a clean close ends it whole; a reset before that is an error. The connection is not reused.
- a Content-Encoding (gzip, deflate, br): decoded before the body is fed (``content_coding.py``; RFC 9110 §8.4);
  the headers handed on no longer list it; a body whose framing ends before its compressed stream does fails.
- a redirect (301, 302, 303, 307, 308) on a request with a ``StreamContext``: its body is not fed (it is not the
  answer); ``location`` is kept for the caller, which follows it or reports it (``lean_transport.py``).
- a response reader that raises (loadgen's parser: a bug) fails the request with ``FeedError``, a counted error.
- a reused connection closed before any byte of its response (a server's idle close racing the request):
  ``ClosedIdle``, retried on a new connection by ``lean_transport.py`` where the request is idempotent.
- bytes past a response's end (a Content-Length counted in characters, not UTF-8 bytes): it stands, its connection
  is closed, not pooled, so the next request goes out on a fresh one (RFC 9112 §9.6, §11.2 response splitting).
  A transfer coding other than chunked fails the request naming it (RFC 9112 §7; ``content_coding.py``).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from typing import AsyncIterator, Callable

import httptools
import httpx

from loadgen.drivers.content_coding import BodyDecoder, decoding
from loadgen.drivers.errors import ClosedIdle, FeedError
from loadgen.drivers.kernel_stamps import count_events
from loadgen.drivers.response_head import ends_at_close, header_value
from loadgen.drivers.stream_context import CONTEXT_KEY, StreamContext
from loadgen.drivers.timing import sleep_until
from loadgen.drivers.wire_capture import WireCapture

REDIRECTS = (301, 302, 303, 307, 308)


class Connection(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection: writes a request, parses its response with httptools."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: deque[bytes] = deque()
        self.wakeup = asyncio.Event()
        self.done = True
        self.keep_alive = True
        self.error: Exception | None = None
        self.ctx: StreamContext | None = None
        self._feed: Callable[[bytes, int], None] | None = None
        self._pending: list[bytes] = []  # body bytes of the read being parsed (one feed per read, not per chunk)
        self._t_ns, self.connect_ns = 0, 0  # the read's arrival; how long opening it took (set by lean_transport.py)
        self._interim = False  # the response being parsed is a 1xx (skipped)
        self._until_close = False  # its body ends when the connection closes (RFC 9112 §6.3 rule 8)
        self._discard = False  # its body is not the answer (a redirect's)
        self._decode: BodyDecoder | None = None
        self._capture: WireCapture | None = None  # into the context's ``raw`` (--capture)
        self.requests_sent = 0  # on this connection: more than one, and it was reused
        self.idle_since_ns = 0  # when it went back to the pool (lean_transport.py expires idle connections)
        self._answered = False  # some byte of the current request's response has come

    # ---- asyncio callbacks ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:  # asyncio's transports (TLS): stamped here, before any parsing
        self.received(data, time.monotonic_ns())

    def received(self, data: bytes, t_ns: int) -> None:
        """One read and its arrival (``stamped_socket.py``: the kernel's receive time of its last packet)."""
        if self.done:  # no response is awaited: bytes past the last one's end
            return self._spoilt()
        self._t_ns = t_ns
        self._answered = True
        if self._capture is not None:
            self._capture.read(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("unexpected protocol upgrade"))
        except httptools.HttpParserCallbackError as exc:  # one of the callbacks below raised: a bug
            cause = exc.__context__
            self._fail(FeedError(f"{type(cause).__name__}: {cause}"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"bad HTTP from server: {exc}"))
        finally:
            pending = self._pending
            if pending and self._feed is not None:  # every HTTP chunk of this read, fed as one
                self._pending = []
                body = pending[0] if len(pending) == 1 else b"".join(pending)
                count_events(body)
                self._feed_read(body)

    def _feed_read(self, data: bytes) -> None:
        try:
            self._feed(data, self._t_ns)  # type: ignore[misc] - checked by the caller
        except Exception as exc:  # noqa: BLE001 - the reader's bug fails this request, not the run
            self._feed = None
            self.done = False  # failed even when its last byte came in this read: _fail fails the response
            self._fail(FeedError(f"{type(exc).__name__}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.done and exc is None and self._until_close:  # RFC 9112 §6.3 rule 8: the close ends it
            self.keep_alive = False
            self.on_message_complete()  # a compressed stream cut short by the close fails there
        elif not self.done and not self._answered and self.requests_sent > 1:
            # a close, or a reset: Linux resets when our request lay unread in the closing socket's buffer
            why = exc or "closed"
            self._fail(ClosedIdle(f"the server closed an idle keep-alive connection as the request went out ({why})"))
        elif not self.done:
            self._fail(httpx.ReadError(f"connection lost mid-response: {exc or 'closed by peer'}"))

    # ---- httptools callbacks --------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.done:  # another response after the one awaited had ended: not parsed (_fail closes the connection)
            raise ValueError("a response after the awaited one ended")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self._interim = 100 <= status < 200  # RFC 9110 §15.2: skip it, the final response follows
        if self._capture is not None:
            self._capture.head_ended(self._interim)
        if self._interim:
            self.headers = []
            return
        self.keep_alive = self.parser.should_keep_alive()
        self._until_close = ends_at_close(status, self.headers)
        if self.ctx is not None:
            self.ctx.http_version, self.ctx.t_headers_ns = self.parser.get_http_version(), self._t_ns
            self.ctx.location = header_value(self.headers, b"location") if status in REDIRECTS else None
            self._discard = status in REDIRECTS
        try:
            self._decode, self.headers = decoding(self.headers)
        except httpx.DecodingError as exc:
            return self._fail(exc)
        if self.head is not None and not self.head.done():
            self.head.set_result((status, self.headers))

    def on_body(self, body: bytes) -> None:
        if self._discard:
            return
        if self._decode is not None:
            try:
                body = self._decode(body)
            except httpx.DecodingError as exc:  # the server's bytes are bad
                self._discard = True
                return self._fail(exc)
        if self._capture is not None:
            self._capture.keep(body)
        if self._feed is not None:
            self._pending.append(body)
        else:
            self.body.append(body)
            self.wakeup.set()

    def on_message_complete(self) -> None:
        if self._interim:  # the 1xx ended; the final response's head is next
            self._interim = False
            return
        if self._decode is not None and not self._discard and not self._decode.complete():
            return self._fail(self._decode.cut_short(self._until_close))  # cut short, or a bad response
        self.done = True
        self.wakeup.set()

    def _fail(self, error: Exception) -> None:
        if self.done and self.head is not None and self.head.done():  # after the response ended: bytes past it
            return self._spoilt()
        self.error, self.done = error, True
        self._discard = True  # nothing after a failure is fed
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        self.wakeup.set()
        self._spoilt()

    def _spoilt(self) -> None:
        """Bytes past a response's end: it stands, its connection is not reused (RFC 9112 §9.6, §11.2)."""
        self.keep_alive = False  # what the response's own bytes in this read held is still fed
        if self.transport is not None:
            self.transport.abort()

    # ---- request/response ------------------------------------------------------------------------------
    async def send_bytes(self, data: bytes, ctx: StreamContext | None) -> tuple[int, list[tuple[bytes, bytes]]]:
        """A serialized request: held until ``ctx.not_before_ns``, stamped, written in one call; returns
        (status, headers) when the response's head has arrived."""
        self.ctx = ctx
        self._feed = ctx.feed if ctx is not None else None
        self.head = asyncio.get_running_loop().create_future()
        self.headers, self.done, self.error = [], False, None
        self.requests_sent, self._answered = self.requests_sent + 1, False
        self._interim = self._until_close = self._discard = False
        self._decode = None
        self._capture = WireCapture(ctx.raw) if ctx is not None and ctx.raw is not None else None
        self.body.clear()
        if ctx is not None:  # a fresh connection's opening time goes with its first request only
            ctx.connect_ns, ctx.t_headers_ns, self.connect_ns = self.connect_ns, None, 0
            await sleep_until(ctx.not_before_ns)  # other streams keep being read while this one waits
            ctx.t_sent_ns = time.monotonic_ns()
        if self.transport is None:  # closed while the request waited for its send time
            fault = ClosedIdle if self.requests_sent > 1 else httpx.WriteError
            raise fault("connection closed before the request was sent")
        self.transport.write(data)
        return await self.head

    async def wait_done(self) -> None:
        """Until the response has ended (its body went to the context's ``feed``); its error, if any."""
        while not self.done:
            self.wakeup.clear()
            await self.wakeup.wait()
        if self.error is not None:
            raise self.error

    async def iter_body(self) -> AsyncIterator[bytes]:
        while True:
            while self.body:
                yield self.body.popleft()
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            self.wakeup.clear()
            await self.wakeup.wait()

    def reusable(self) -> bool:
        return self.done and self.error is None and self.keep_alive and self.transport is not None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
