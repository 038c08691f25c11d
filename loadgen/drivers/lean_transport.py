"""Theory of operation: a lean ``httpx.AsyncBaseTransport`` for HTTP/1.1 keep-alive on loopback/LAN.

httpx's default transport (httpcore) stacks pool locks, anyio streams and per-chunk async iteration between
the socket and the caller: on this machine that put ~1 ms between the stamp taken before ``client.stream()``
and the bytes actually leaving, and delayed every chunk's stamp. Here one ``asyncio.Protocol`` per connection
writes the request (serialized by h11) and parses the response with httptools (llhttp, C; h11's pure-Python
chunked reader cost ~20 µs a chunk, the largest item in a profile at 64 streams), and:

- stamps the send just before the request's single ``transport.write`` (``StreamContext.t_sent_ns``);
- stamps each read on arrival, in ``data_received``, before parsing; when the request carries a
  ``StreamContext`` with ``feed``, body bytes go straight to it as ``feed(bytes, t_ns)`` and the response's
  stream yields nothing (the caller just drains it) — the hot path is one callback, no task switch.

Without a context it behaves as an ordinary transport (body bytes are yielded), so the same client serves
``/models`` and ``/tokenize``. ``https://`` runs over asyncio's TLS transport with the same protocol object
(``ssl_context``): the send stamp is taken just before the plaintext goes to the TLS layer's ``write`` (which
encrypts and writes at once), reads are stamped when the TLS layer hands over decrypted bytes.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
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


class _Connection(asyncio.Protocol):
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
            self._feed(body, self._t_ns)
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
        body = await request.aread()
        writer = h11.Connection(h11.CLIENT)
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"transfer-encoding"]
        if body and not any(k.lower() == b"content-length" for k, _ in headers):
            headers.append((b"content-length", str(len(body)).encode()))
        data = writer.send(h11.Request(method=request.method, target=request.url.raw_path, headers=headers))
        data += (writer.send(h11.Data(data=body)) if body else b"") + writer.send(h11.EndOfMessage())
        self.ctx = request.extensions.get(CONTEXT_KEY)
        self._feed = self.ctx.feed if self.ctx is not None else None
        self.head = asyncio.get_running_loop().create_future()
        self.headers, self.done, self.error = [], False, None
        self.body.clear()
        if self.ctx is not None:
            await sleep_until(self.ctx.not_before_ns)  # other streams keep being read while this one waits
            self.ctx.t_sent_ns = time.monotonic_ns()
        if self.transport is None:
            raise httpx.WriteError("connection closed before the request was sent")
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
        return self.done and self.error is None and self.keep_alive and self.transport is not None

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
    def __init__(self, connect_timeout_s: float = 10.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        scheme = request.url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"the lean transport speaks http:// and https://, not {scheme}://")
        origin = (scheme, request.url.host, request.url.port or (443 if scheme == "https" else 80))
        conn = await self._acquire(origin)
        try:
            status, headers = await conn.send(request)
        except BaseException:
            conn.close()
            raise
        return httpx.Response(status, headers=headers, stream=_Body(conn, self._release),
                              extensions={"http_version": b"HTTP/1.1"})

    async def _acquire(self, origin: tuple[str, str, int]) -> _Connection:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        scheme, host, port = origin
        tls: dict[str, object] = {}
        if scheme == "https":
            tls = {"ssl": self.ssl_context or ssl.create_default_context(), "server_hostname": host}
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Connection(origin), host, port, **tls),
                                             self.connect_timeout_s)
        except ssl.SSLError as exc:
            raise httpx.ConnectError(f"{host}:{port}: TLS: {exc.reason or exc}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            reason = exc or f"no connection within {self.connect_timeout_s:g} s"
            raise httpx.ConnectError(f"{host}:{port}: {reason}") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.reusable():
            self._idle.setdefault(conn.origin, []).append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


_SPENT = httpx.ByteStream(b"")


def drop_stream(resp: httpx.Response) -> None:
    """Break httpx's response ↔ stream reference cycle once a response is read and closed, so that reference
    counting frees it (and the tracker its request points to) at once: the run turns automatic GC off."""
    resp.stream = _SPENT
