"""One HTTP/1.1 connection of the lean transport (``lean_transport.py`` has the theory of operation): an
``asyncio.Protocol`` that writes a request in one call and parses the response with httptools, stamping each
read on arrival and handing body bytes to the request's ``StreamContext.feed``, one feed per read."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import h11
import httptools
import httpx

from loadgen.drivers.timing import sleep_until

CONTEXT_KEY = "loadgen.stream"


@dataclass
class StreamContext:
    """Passed as ``extensions={CONTEXT_KEY: ctx}``; the transport fills ``t_sent_ns`` and calls ``feed``."""

    feed: Callable[[bytes, int], None] | None = None
    t_sent_ns: int = 0
    not_before_ns: int = 0  # hold the prepared request until this instant (the plan's send time)


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
        self._t_ns = 0

    # ---- asyncio callbacks ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._t_ns = time.monotonic_ns()  # the read's arrival, before any parsing
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("unexpected protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"bad HTTP from server: {exc}"))
        finally:
            pending = self._pending
            if pending and self._feed is not None:  # every HTTP chunk of this read, fed as one
                self._pending = []
                self._feed(pending[0] if len(pending) == 1 else b"".join(pending), self._t_ns)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.done:
            self._fail(httpx.ReadError(f"connection lost mid-response: {exc or 'closed by peer'}"))

    # ---- httptools callbacks --------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.head is not None and not self.head.done():
            self.head.set_result((self.parser.get_status_code(), self.headers))

    def on_body(self, body: bytes) -> None:
        if self._feed is not None:
            self._pending.append(body)
        else:
            self.body.append(body)
            self.wakeup.set()

    def on_message_complete(self) -> None:
        self.done = True
        self.wakeup.set()

    def _fail(self, error: Exception) -> None:
        if self.done and self.head is not None and self.head.done():
            return
        self.error, self.done = error, True
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        self.wakeup.set()
        if self.transport is not None:
            self.transport.abort()

    # ---- request/response ------------------------------------------------------------------------------
    async def send(self, request: httpx.Request) -> tuple[int, list[tuple[bytes, bytes]]]:
        """An httpx request, serialized by h11; returns (status, headers) when the head has arrived."""
        body = await request.aread()
        writer = h11.Connection(h11.CLIENT)
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"transfer-encoding"]
        if body and not any(k.lower() == b"content-length" for k, _ in headers):
            headers.append((b"content-length", str(len(body)).encode()))
        data = writer.send(h11.Request(method=request.method, target=request.url.raw_path, headers=headers))
        data += (writer.send(h11.Data(data=body)) if body else b"") + writer.send(h11.EndOfMessage())
        return await self.send_bytes(data, request.extensions.get(CONTEXT_KEY))

    async def send_bytes(self, data: bytes, ctx: StreamContext | None) -> tuple[int, list[tuple[bytes, bytes]]]:
        """A serialized request: held until ``ctx.not_before_ns``, stamped, written in one call; returns
        (status, headers) when the response's head has arrived."""
        self.ctx = ctx
        self._feed = ctx.feed if ctx is not None else None
        self.head = asyncio.get_running_loop().create_future()
        self.headers, self.done, self.error = [], False, None
        self.body.clear()
        if ctx is not None:
            await sleep_until(ctx.not_before_ns)  # other streams keep being read while this one waits
            ctx.t_sent_ns = time.monotonic_ns()
        if self.transport is None:
            raise httpx.WriteError("connection closed before the request was sent")
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
