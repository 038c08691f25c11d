"""Theory of operation: a lean ``httpx.AsyncBaseTransport`` for HTTP/1.1 keep-alive on loopback/LAN.

httpx's default transport (httpcore) stacks pool locks, anyio streams and per-chunk async iteration between
the socket and the caller: on this machine that put ~1 ms between the stamp taken before ``client.stream()``
and the bytes actually leaving, and delayed every chunk's stamp. Here one ``asyncio.Protocol`` per connection
writes the request (serialized by h11) and parses the response with httptools (llhttp, C; h11's pure-Python
chunked reader cost ~20 µs a chunk, the largest item in a profile at 64 streams), and:

- stamps the send just before the request's single ``transport.write`` (``StreamContext.t_sent_ns``);
- stamps each read on arrival, in ``data_received``, before parsing; when the request carries a
  ``StreamContext`` with ``feed``, the read's body bytes (every HTTP chunk in it, joined) go straight to it as
  one ``feed(bytes, t_ns)`` and the response's stream yields nothing (the caller just drains it) — the hot
  path is one callback per read, no task switch. Under load a read holds several chunks (four on average at
  128 streams): one feed decodes them together.

Without a context it behaves as an ordinary transport (body bytes are yielded), so the same client serves
``/models`` and ``/tokenize``. ``https://`` runs over asyncio's TLS transport with the same protocol object
(``ssl_context``): the send stamp is taken just before the plaintext goes to the TLS layer's ``write`` (which
encrypts and writes at once), reads are stamped when the TLS layer hands over decrypted bytes.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import h11
import httpx

from loadgen.drivers.http_conn import CONTEXT_KEY, Connection, StreamContext

__all__ = ["CONTEXT_KEY", "LeanTransport", "PreparedPost", "StreamContext", "drop_stream"]
USER_AGENT = "loadgen"


@dataclass(frozen=True)
class PreparedPost:
    """A POST's origin and request head up to its content-length, built (and checked by h11) once a run."""

    origin: tuple[str, str, int]
    head: bytes  # ends in b"content-length: "

    def request(self, body: bytes) -> bytes:
        return b"%s%d\r\n\r\n%s" % (self.head, len(body), body)


class _Body(httpx.AsyncByteStream):
    def __init__(self, conn: Connection, release: Callable[[Connection], None]) -> None:
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
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}

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

    # ---- the hot path: no httpx Request or Response per request ---------------------------------------
    @staticmethod
    def of(client: httpx.AsyncClient) -> "LeanTransport | None":
        """The client's transport, when it is this one."""
        transport = getattr(client, "_transport", None)
        return transport if isinstance(transport, LeanTransport) else None

    def prepare_post(self, url: str, headers: dict[str, str]) -> PreparedPost:
        """The head of every POST to ``url`` with ``headers``; h11 validates it (a bad header is an
        h11.LocalProtocolError here, before anything is sent)."""
        u = httpx.URL(url)
        if u.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"the lean transport speaks http:// and https://, not {u.scheme}://")
        given = {k.lower() for k in headers}
        defaults = [(k, v) for k, v in (("user-agent", USER_AGENT), ("accept", "*/*")) if k not in given]
        fields = [("host", u.netloc.decode("ascii")), *defaults,
                  *((k, v) for k, v in headers.items() if k.lower() not in ("host", "content-length"))]
        h11.Connection(h11.CLIENT).send(h11.Request(method="POST", target=u.raw_path,
                                                    headers=[*fields, ("content-length", "0")]))
        head = b"POST %s HTTP/1.1\r\n" % u.raw_path + b"".join(
            b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in fields)
        return PreparedPost((u.scheme, u.host, u.port or (443 if u.scheme == "https" else 80)),
                            head + b"content-length: ")

    async def post(self, prepared: PreparedPost, body: bytes, ctx: StreamContext) -> int:
        """Send the POST and read its response to the end (the body goes to ``ctx.feed``); the status. Faults
        raise the httpx errors ``handle_async_request`` would."""
        conn = await self._acquire(prepared.origin)
        try:
            status, _ = await conn.send_bytes(prepared.request(body), ctx)
            await conn.wait_done()
        except BaseException:
            conn.close()
            raise
        self._release(conn)
        return status

    async def post_bytes(self, prepared: PreparedPost, body: bytes) -> tuple[int, bytes]:
        """A plain (not streamed) POST: the status and the whole answer."""
        answer = bytearray()
        status = await self.post(prepared, body, StreamContext(feed=lambda data, _t_ns: answer.extend(data)))
        return status, bytes(answer)

    async def _acquire(self, origin: tuple[str, str, int]) -> Connection:
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
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: Connection(origin), host, port, **tls),
                                             self.connect_timeout_s)
        except ssl.SSLError as exc:
            raise httpx.ConnectError(f"{host}:{port}: TLS: {exc.reason or exc}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            reason = exc or f"no connection within {self.connect_timeout_s:g} s"
            raise httpx.ConnectError(f"{host}:{port}: {reason}") from None
        return conn

    def _release(self, conn: Connection) -> None:
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


async def send_post(client: httpx.AsyncClient, direct: tuple[LeanTransport, PreparedPost] | None, url: str,
                    headers: dict[str, str], body: bytes, ctx: StreamContext) -> int:
    """One streaming POST to its end, its body fed to ``ctx.feed``; the status. ``direct``: the lean
    transport's own path (a prepared head, no httpx objects: ~17 % of the loop's time at 128 streams went to
    httpx's request and response); None: through the client (any other transport)."""
    if direct is not None:
        return await direct[0].post(direct[1], body, ctx)
    feed = ctx.feed
    async with client.stream("POST", url, content=body, headers=headers, extensions={CONTEXT_KEY: ctx}) as resp:
        status = resp.status_code
        async for data in resp.aiter_raw():  # empty with the lean transport
            if feed is not None:
                feed(data, time.monotonic_ns())
    drop_stream(resp)
    return status


def direct_post(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> tuple[LeanTransport, PreparedPost] | None:
    """The lean transport's direct path for POSTs to ``url``, when the client is on it and h11 accepts the
    head; else None (``send_post`` then goes through the client, which reports a bad header per request)."""
    lean = LeanTransport.of(client)
    if lean is None:
        return None
    try:
        return lean, lean.prepare_post(url, headers)
    except (h11.LocalProtocolError, httpx.UnsupportedProtocol, UnicodeEncodeError):
        return None
