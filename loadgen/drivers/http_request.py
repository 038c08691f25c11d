"""HTTP/1.1 request heads as bytes (RFC 9112 §3): the prepared POST head of the hot path, and any httpx
request serialized by h11 (which refuses a malformed header before anything is sent)."""

from __future__ import annotations

from dataclasses import dataclass

import h11
import httpx

from loadgen.drivers.proxy import Proxy

USER_AGENT = "loadgen"


@dataclass(frozen=True)
class PreparedPost:
    """A POST's origin and request head up to its content-length, built (and checked by h11) once a run."""

    origin: tuple[str, str, int]
    head: bytes  # ends in b"content-length: "

    def request(self, body: bytes) -> bytes:
        return b"%s%d\r\n\r\n%s" % (self.head, len(body), body)


def origin_of(u: httpx.URL) -> tuple[str, str, int]:
    """(scheme, host, port): the scheme's default port where the URL names none (RFC 9110 §4.2.1, §4.2.2); port 0
    is no server's (it asks the OS for any port), never read as the default: httpx.ConnectError."""
    if u.port == 0:
        raise httpx.ConnectError(f"{u.host}:0: port 0 is no server's port; give one from 1 to 65535")
    return u.scheme, u.host, u.port if u.port is not None else default_port(u.scheme)


def default_port(scheme: str) -> int:
    """The port a URL of ``scheme`` means when it names none (RFC 9110 §4.2.1 http, §4.2.2 https)."""
    return 443 if scheme == "https" else 80


def host_header(u: httpx.URL) -> str:
    """The Host header: the URL's host and port, without its user information."""
    return u.netloc.decode("ascii").rsplit("@", 1)[-1]


def request_target(u: httpx.URL, proxy: Proxy | None) -> bytes:
    """The request target: origin-form, or absolute-form to a forward proxy (RFC 9112 §3.2.2)."""
    if proxy is None:
        return u.raw_path
    return b"%s://%s%s" % (u.raw_scheme, host_header(u).encode("ascii"), u.raw_path)


def serialize(request: httpx.Request, body: bytes, proxy: Proxy | None) -> bytes:
    """An httpx request as bytes (h11 checks it): origin-form, or absolute-form to ``proxy``."""
    writer = h11.Connection(h11.CLIENT)
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"transfer-encoding"]
    if body and not any(k.lower() == b"content-length" for k, _ in headers):
        headers.append((b"content-length", str(len(body)).encode()))
    if proxy is not None and proxy.authorization:
        headers.append((b"proxy-authorization", proxy.authorization.encode("latin-1")))
    data = writer.send(h11.Request(method=request.method, target=request_target(request.url, proxy),
                                   headers=headers))
    return data + (writer.send(h11.Data(data=body)) if body else b"") + writer.send(h11.EndOfMessage())
