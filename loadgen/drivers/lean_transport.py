"""Theory of operation: a lean ``httpx.AsyncBaseTransport`` for HTTP/1.1 keep-alive on loopback/LAN.

httpx's default transport (httpcore) stacks pool locks, anyio streams and per-chunk async iteration between
the socket and the caller: on this machine that put ~1 ms between the stamp taken before ``client.stream()``
and the bytes actually leaving, and delayed every chunk's stamp. Here one ``asyncio.Protocol`` per connection
writes the request (serialized by h11) and parses the response with httptools (llhttp, C; h11's pure-Python
chunked reader cost ~20 µs a chunk, the largest item in a profile at 64 streams), and:

- stamps the send just before the request's single ``transport.write`` (``StreamContext.t_sent_ns``);
- stamps each read with its arrival: with ``kernel_stamps`` on (the default where the platform has them) the
  kernel's receive time of the read's last packet, read with ``recvmsg`` by ``stamped_socket.py`` (https: TLS on
  memory BIOs fed from it, ``stamped_tls.py``) — not delayed by the loop's other work; else (asyncio's
  transports) a clock read in ``data_received``, before parsing; when the request carries a
  ``StreamContext`` with ``feed``, the read's body bytes (every HTTP chunk in it, joined) go straight to it as
  one ``feed(bytes, t_ns)`` and the response's stream yields nothing (the caller just drains it) — the hot
  path is one callback per read, no task switch. Under load a read holds several chunks (four on average at
  128 streams): one feed decodes them together.

Without a context it behaves as an ordinary transport (body bytes are yielded), so the same client serves
``/models`` and ``/tokenize``. ``https://`` runs the same protocol object over TLS (``ssl_context``): the send
stamp is taken just before the plaintext goes to the TLS layer's ``write`` (which encrypts and writes at once).

Proxies named by the environment are used as curl and httpx use them (``proxy.py``: absolute-form requests for
http, a CONNECT tunnel for https); ``use_proxy_env=False`` (the embedded simulator) goes direct. Redirects of
the streamed POSTs are reported or followed by ``streamed_post.send_post`` (``redirects.py``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import AsyncIterator, Callable

import h11
import httpx

from loadgen.drivers.errors import ClosedIdle
from loadgen.drivers.http_conn import Connection
from loadgen.drivers.kernel_stamps import supported as kernel_stamps_supported
from loadgen.drivers.stamped_socket import open_stamped
from loadgen.drivers.stamped_tls import open_stamped_tls
from loadgen.drivers.stream_context import CONTEXT_KEY, StreamContext
from loadgen.drivers.http_request import USER_AGENT, PreparedPost, host_header, origin_of, request_target, serialize
from loadgen.drivers.proxy import Proxy, ProxyError, open_tunnel, proxy_for, unreachable

__all__ = ["CONTEXT_KEY", "LeanTransport", "PreparedPost", "StreamContext"]
Origin = tuple[str, str, int]
IDEMPOTENT = ("GET", "HEAD", "OPTIONS", "PUT", "DELETE")  # RFC 9110 §9.2.2: retried after ClosedIdle


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


# A pooled connection idle longer than this is closed, not reused: uvicorn (vLLM, SGLang) and cpp-httplib
# (llama-server) close connections idle for 5 s, and a request sent as they do meets a closed connection (httpx's
# pool expires them at 5 s; 4 s keeps clear of the servers' 5 s). RFC 9112 §9.6: either side may close an idle
# connection at any time.
KEEPALIVE_EXPIRY_S = 4.0


class LeanTransport(httpx.AsyncBaseTransport):
    def __init__(self, connect_timeout_s: float = 10.0, ssl_context: ssl.SSLContext | None = None,
                 use_proxy_env: bool = True, keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
                 kernel_stamps: bool | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_expiry_ns = int(keepalive_expiry_s * 1e9)
        self.ssl_context = ssl_context
        self.use_proxy_env = use_proxy_env
        self.kernel_stamps = kernel_stamps_supported() if kernel_stamps is None else kernel_stamps
        self._idle: dict[Origin, list[Connection]] = {}
        self._proxies: dict[Origin, Proxy | None] = {}

    def proxy(self, origin: Origin) -> Proxy | None:
        """The environment's proxy for ``origin`` (None: direct); ProxyError for one that cannot be used."""
        if not self.use_proxy_env:
            return None
        if origin not in self._proxies:
            scheme, host, port = origin
            self._proxies[origin] = proxy_for(f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}")
        return self._proxies[origin]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        scheme = request.url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"the lean transport speaks http:// and https://, not {scheme}://")
        origin = origin_of(request.url)
        proxy = self._forward_proxy(origin)
        data = serialize(request, await request.aread(), proxy)
        ctx = request.extensions.get(CONTEXT_KEY)
        try:
            conn, status, headers = await self._send(origin, data, ctx, fresh=False)
        except ClosedIdle:
            if request.method not in IDEMPOTENT:
                raise
            conn, status, headers = await self._send(origin, data, ctx, fresh=True)
        return httpx.Response(status, headers=headers, stream=_Body(conn, self._release),
                              extensions={"http_version": b"HTTP/1.1"})

    async def _send(self, origin: Origin, data: bytes, ctx: StreamContext | None,
                    fresh: bool) -> tuple[Connection, int, list[tuple[bytes, bytes]]]:
        conn = await self._acquire(origin, fresh)
        try:
            status, headers = await conn.send_bytes(data, ctx)
        except BaseException:
            conn.close()
            raise
        return conn, status, headers

    def _forward_proxy(self, origin: Origin) -> Proxy | None:
        """The proxy an http:// request goes to in absolute form (https ones go through a tunnel); an environment's
        proxy that cannot be used for ``origin`` (a redirect's too) is an httpx.ConnectError, as in ``_acquire``."""
        try:
            return self.proxy(origin) if origin[0] == "http" else None
        except ProxyError as exc:
            raise httpx.ConnectError(f"{origin[1]}:{origin[2]}: {exc}") from None

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
        origin = origin_of(u)
        proxy = self._forward_proxy(origin)
        given = {k.lower() for k in headers}
        defaults = [(k, v) for k, v in (("user-agent", USER_AGENT), ("accept", "*/*")) if k not in given]
        fields = [("host", host_header(u)), *defaults,
                  *((k, v) for k, v in headers.items() if k.lower() not in ("host", "content-length"))]
        if proxy is not None and proxy.authorization:
            fields.append(("proxy-authorization", proxy.authorization))
        target = request_target(u, proxy)
        h11.Connection(h11.CLIENT).send(h11.Request(method="POST", target=target,
                                                    headers=[*fields, ("content-length", "0")]))
        head = b"POST %s HTTP/1.1\r\n" % target + b"".join(
            b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in fields)
        return PreparedPost(origin, head + b"content-length: ")

    async def post(self, prepared: PreparedPost, body: bytes, ctx: StreamContext, fresh: bool = False) -> int:
        """Send the POST and read its response to the end (the body goes to ``ctx.feed``); the status. Faults
        raise the httpx errors ``handle_async_request`` would. ``fresh``: on a new connection, not a pooled one."""
        conn = await self._acquire(prepared.origin, fresh)
        try:
            status, _ = await conn.send_bytes(prepared.request(body), ctx)
            await conn.wait_done()
        except BaseException:
            conn.close()
            raise
        self._release(conn)
        return status

    async def post_bytes(self, prepared: PreparedPost, body: bytes) -> tuple[int, bytes]:
        """A plain (not streamed) POST of a read-only endpoint (``/tokenize``, ``/apply-template``): the status
        and the whole answer. Idempotent by its semantics, so a pooled connection that the server closed as the
        request went out (``ClosedIdle``) is retried once on a new one (RFC 9112 §9.3.1.1)."""
        try:
            return await self._post_bytes(prepared, body, fresh=False)
        except ClosedIdle:
            return await self._post_bytes(prepared, body, fresh=True)

    async def _post_bytes(self, prepared: PreparedPost, body: bytes, fresh: bool) -> tuple[int, bytes]:
        answer = bytearray()
        status = await self.post(prepared, body, StreamContext(feed=lambda data, _t_ns: answer.extend(data)), fresh)
        return status, bytes(answer)

    async def _acquire(self, origin: tuple[str, str, int], fresh: bool = False) -> Connection:
        idle = self._idle.get(origin) if not fresh else None
        oldest_ns = time.monotonic_ns() - self.keepalive_expiry_ns
        while idle:
            conn = idle.pop()  # the most recently used first: when it has expired, so have the others
            if conn.transport is not None and not conn.transport.is_closing() and conn.idle_since_ns >= oldest_ns:
                return conn
            conn.close()
        scheme, host, port = origin
        t0_ns = time.monotonic_ns()
        try:
            conn = await asyncio.wait_for(self._connect(origin), self.connect_timeout_s)
        except ssl.SSLError as exc:
            raise httpx.ConnectError(f"{host}:{port}: TLS: {exc.reason or exc}") from None
        except (OSError, asyncio.TimeoutError, ProxyError) as exc:
            reason = exc or f"no connection within {self.connect_timeout_s:g} s"
            raise httpx.ConnectError(f"{host}:{port}: {reason}") from None
        conn.connect_ns = time.monotonic_ns() - t0_ns  # name lookup, TCP, proxy tunnel, TLS handshake
        return conn

    async def _connect(self, origin: Origin) -> Connection:
        """A new connection to ``origin``: direct, to the proxy (http), or through its tunnel (https)."""
        loop = asyncio.get_running_loop()
        scheme, host, port = origin
        proxy = self.proxy(origin)
        if self.kernel_stamps:  # reads stamped by the kernel (stamped_socket.py, stamped_tls.py)
            return await self._connect_stamped(origin, proxy)
        tls: dict[str, object] = {}
        if scheme == "https":
            tls = {"ssl": self.ssl_context or ssl.create_default_context(), "server_hostname": host}
        if proxy is None:
            _, conn = await loop.create_connection(lambda: Connection(origin), host, port, **tls)
        elif scheme == "https":
            sock = await open_tunnel(proxy, host, port, self.connect_timeout_s)
            _, conn = await loop.create_connection(lambda: Connection(origin), sock=sock, **tls)
        else:  # http: every request to the proxy, in absolute form (RFC 9112 §3.2.2)
            try:
                _, conn = await loop.create_connection(lambda: Connection(origin), proxy.host, proxy.port)
            except OSError as exc:
                raise unreachable(proxy, exc) from None
        return conn

    async def _connect_stamped(self, origin: Origin, proxy: Proxy | None) -> Connection:
        scheme, host, port = origin
        if scheme == "https":
            context = self.ssl_context or ssl.create_default_context()
            tunnel = await open_tunnel(proxy, host, port, self.connect_timeout_s) if proxy is not None else None
            return await open_stamped_tls(host, port, lambda: Connection(origin), context, host,  # type: ignore
                                          tunnel)
        try:
            to = (host, port) if proxy is None else (proxy.host, proxy.port)
            return await open_stamped(*to, lambda: Connection(origin))  # type: ignore[return-value]
        except OSError as exc:
            raise exc if proxy is None else unreachable(proxy, exc) from None

    def _release(self, conn: Connection) -> None:
        if conn.reusable():
            conn.idle_since_ns = time.monotonic_ns()
            self._idle.setdefault(conn.origin, []).append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
