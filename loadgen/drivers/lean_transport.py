"""Theory of operation: a lean ``httpx.AsyncBaseTransport`` for HTTP/1.1 keep-alive on loopback/LAN.

httpx's default transport (httpcore) stacks pool locks, anyio streams and per-chunk async iteration between
the socket and the caller: on this machine that put ~1 ms between the stamp taken before ``client.stream()``
and the bytes actually leaving, and delayed every chunk's stamp. Here one ``asyncio.Protocol`` per connection
parses with h11 (as httpcore does) and:

- stamps the send just before the request's single ``transport.write`` (``StreamContext.t_sent_ns``);
- stamps each read on arrival, in ``data_received``, before parsing; when the request carries a
  ``StreamContext`` with ``feed``, body bytes go straight to it as ``feed(bytes, t_ns)`` and the response's
  stream yields nothing (the caller just drains it) — the hot path is one callback, no task switch.

Without a context it behaves as an ordinary transport (body bytes are yielded), so the same client serves
``/models`` and ``/tokenize``. Plain ``http://`` only; use httpx's default transport for TLS.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import h11
import httpx

CONTEXT_KEY = "loadgen.stream"


@dataclass
class StreamContext:
    """Passed as ``extensions={CONTEXT_KEY: ctx}``; the transport fills ``t_sent_ns`` and calls ``feed``."""

    feed: Callable[[bytes, int], None] | None = None
    t_sent_ns: int = 0


class _Connection(asyncio.Protocol):
    def __init__(self, origin: tuple[str, int]) -> None:
        self.origin = origin
        self.h11 = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.head: asyncio.Future[h11.Response] | None = None
        self.body: deque[bytes] = deque()
        self.wakeup = asyncio.Event()
        self.done = False
        self.error: Exception | None = None
        self.ctx: StreamContext | None = None

    # ---- asyncio callbacks ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        t_ns = time.monotonic_ns()
        try:
            self.h11.receive_data(data)
            self._events(t_ns)
        except h11.RemoteProtocolError as exc:
            self._fail(httpx.RemoteProtocolError(f"bad HTTP from server: {exc}"))

    def eof_received(self) -> bool | None:
        try:
            self.h11.receive_data(b"")
            self._events(time.monotonic_ns())
        except h11.RemoteProtocolError as exc:
            self._fail(httpx.RemoteProtocolError(f"connection closed mid-response: {exc}"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.done:
            self._fail(httpx.ReadError(f"connection lost: {exc or 'closed by peer'}"))

    def _events(self, t_ns: int) -> None:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Response):
                if self.head is not None and not self.head.done():
                    self.head.set_result(event)
            elif isinstance(event, h11.Data):
                if self.ctx is not None and self.ctx.feed is not None:
                    self.ctx.feed(bytes(event.data), t_ns)
                else:
                    self.body.append(bytes(event.data))
                    self.wakeup.set()
            elif isinstance(event, h11.EndOfMessage):
                self.done = True
                self.wakeup.set()
                return
            elif isinstance(event, h11.ConnectionClosed):
                self._fail(httpx.RemoteProtocolError("server closed the connection mid-response"))
                return

    def _fail(self, error: Exception) -> None:
        if self.done:
            return
        self.error, self.done = error, True
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        self.wakeup.set()
        if self.transport is not None:
            self.transport.abort()

    # ---- request/response ------------------------------------------------------------------------------
    async def send(self, request: httpx.Request) -> h11.Response:
        body = await request.aread()
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in (b"transfer-encoding",)]
        if body and not any(k.lower() == b"content-length" for k, _ in headers):
            headers.append((b"content-length", str(len(body)).encode()))
        target = request.url.raw_path
        data = self.h11.send(h11.Request(method=request.method, target=target, headers=headers))
        data += self.h11.send(h11.Data(data=body)) if body else b""
        data += self.h11.send(h11.EndOfMessage())
        self.ctx = request.extensions.get(CONTEXT_KEY)
        self.head = asyncio.get_running_loop().create_future()
        self.body.clear()
        self.done, self.error = False, None
        assert self.transport is not None
        if self.ctx is not None:
            self.ctx.t_sent_ns = time.monotonic_ns()
        self.transport.write(data)
        return await self.head

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
        if self.error is not None or self.transport is None:
            return False
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            self.ctx = None
            return True
        return False

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    def __init__(self, conn: _Connection, release: Callable[[_Connection], None]) -> None:
        self.conn, self.release, self.closed = conn, release, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.conn.iter_body():
            yield chunk

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.release(self.conn)


class LeanTransport(httpx.AsyncBaseTransport):
    def __init__(self, connect_timeout_s: float = 10.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol("the lean transport speaks plain http:// only")
        origin = (request.url.host, request.url.port or 80)
        conn = await self._acquire(origin)
        try:
            head = await conn.send(request)
        except BaseException:
            conn.close()
            raise
        headers = [(k, v) for k, v in head.headers]
        return httpx.Response(head.status_code, headers=headers, stream=_Body(conn, self._release),
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": head.reason})

    async def _acquire(self, origin: tuple[str, int]) -> _Connection:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Connection(origin), *origin),
                                             self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise httpx.ConnectError(f"{origin[0]}:{origin[1]}: {exc or 'connect timeout'}") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.done and conn.reusable():
            self._idle.setdefault(conn.origin, []).append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
