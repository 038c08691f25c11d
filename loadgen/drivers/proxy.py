"""Proxies from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``, either case), as
curl and httpx read them, for the lean transport and the /metrics scraper alike: one run, one route.

- ``http://`` targets go to the proxy with the request target in absolute form (RFC 9112 §3.2.2: "When making a
  request to a proxy, other than a CONNECT or server-wide OPTIONS request, a client MUST send the target URI in
  absolute-form").
- ``https://`` targets go through a tunnel: ``CONNECT host:port`` (RFC 9110 §9.3.6; any 2xx answer opens it),
  then TLS with the target inside it, so the proxy never sees the requests.
- Credentials in the proxy URL (``http://user:pw@proxy:3128``) become ``Proxy-Authorization: Basic``
  (RFC 9110 §11.7.1, RFC 7617); they are secrets like the API key: never shown.
- A proxy URL loadgen cannot use (``https://`` or ``socks5://`` proxies) is ``ProxyError`` naming the variable:
  a run refuses to start (exit 2) rather than measure another route than the one configured.
- ``NO_PROXY``: comma-separated host names or domain suffixes (``.example.com``), ``host:port``, or ``*`` (the
  standard library's ``proxy_bypass_environment`` rules).

The embedded simulator is on loopback by construction and is never proxied.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit


class ProxyError(Exception):
    """A proxy setting that cannot be used, or a proxy that refused the tunnel."""


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    variable: str  # the environment variable it came from (for messages)
    authorization: str | None = None  # the Proxy-Authorization value, when the URL has credentials

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _variable(scheme: str) -> str | None:
    """The set variable a scheme's proxy comes from (lower case wins, as urllib and curl read it)."""
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"):
        if os.environ.get(name):
            return name
    return None


def proxy_for(url: str) -> Proxy | None:
    """The proxy the environment names for ``url``, or None (none set, or ``NO_PROXY`` covers its host)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    found = proxies.get(parts.scheme) or proxies.get("all")
    if not found or urllib.request.proxy_bypass_environment(parts.netloc.rsplit("@", 1)[-1], proxies):
        return None
    variable = _variable(parts.scheme) or f"{parts.scheme.upper()}_PROXY"
    proxy = urlsplit(found if "://" in found else f"http://{found}")
    if proxy.scheme != "http":
        raise ProxyError(f"{variable}: a {proxy.scheme}:// proxy is not supported; give an http:// proxy URL "
                         "(https targets are tunnelled through it with CONNECT), or exclude the target with NO_PROXY")
    try:
        port = 80 if proxy.port is None else proxy.port
    except ValueError:
        port = 0
    if port == 0:  # port 0 is no proxy's: not read as the default 80
        raise ProxyError(f"{variable}: the proxy's port is not a number from 1 to 65535")
    if not proxy.hostname:
        raise ProxyError(f"{variable}: no proxy host in its URL")
    auth = None
    if proxy.username is not None:
        pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
        auth = "Basic " + base64.b64encode(pair).decode("ascii")
    return Proxy(proxy.hostname, port, variable, auth)


def proxy_secrets() -> list[str]:
    """The secret parts of every proxy variable: passwords, and the Basic credentials built from them."""
    out: list[str] = []
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        value = os.environ.get(name)
        if not value:
            continue
        parts = urlsplit(value if "://" in value else f"http://{value}")
        if parts.password:
            out += [parts.password, unquote(parts.password)]
            pair = f"{unquote(parts.username or '')}:{unquote(parts.password)}".encode()
            out.append(base64.b64encode(pair).decode("ascii"))
    return out


CONNECT_HEAD_BYTES = 16 * 1024


def unreachable(proxy: Proxy, exc: OSError) -> ProxyError:
    """No connection to the proxy itself: said as the proxy's and its variable's, not as the target's."""
    return ProxyError(f"cannot connect to the proxy {proxy.url} ({proxy.variable}): {exc.strerror or exc}")


async def open_tunnel(proxy: Proxy, host: str, port: int, timeout_s: float) -> socket.socket:
    """A socket connected through ``proxy`` to ``host:port`` (CONNECT, RFC 9110 §9.3.6), ready for TLS."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise unreachable(proxy, exc) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(_connect(loop, sock, address, proxy, host, port), timeout_s)
    except BaseException:
        sock.close()
        raise
    return sock


async def _connect(loop: asyncio.AbstractEventLoop, sock: socket.socket, address: object, proxy: Proxy,
                   host: str, port: int) -> None:
    try:
        await loop.sock_connect(sock, address)
    except OSError as exc:
        raise unreachable(proxy, exc) from None
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
    if proxy.authorization:
        head += f"Proxy-Authorization: {proxy.authorization}\r\n"
    await loop.sock_sendall(sock, (head + "\r\n").encode("latin-1"))
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = await loop.sock_recv(sock, 4096)
        if not data or len(answer) > CONNECT_HEAD_BYTES:
            raise ProxyError(f"the proxy {proxy.url} ({proxy.variable}) closed the tunnel to {authority} "
                             "before answering CONNECT")
        answer += data
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    status = status_line.split(" ", 2)
    if len(status) < 2 or not status[1].startswith("2"):
        raise ProxyError(f"the proxy {proxy.url} ({proxy.variable}) refused CONNECT {authority}: {status_line}")
    if answer.split(b"\r\n\r\n", 1)[1]:
        raise ProxyError(f"the proxy {proxy.url} sent bytes before the tunnel opened")
