"""A forward proxy on 127.0.0.1, in a thread of the test process, for the proxy tests (tests/test_proxy.py).

- ``CONNECT host:port`` (RFC 9110 §9.3.6): connects to the target, answers ``200 Connection established`` and
  copies bytes both ways until either side closes; ``refuse_connect`` answers ``403 Forbidden`` instead.
- absolute-form requests (RFC 9112 §3.2.2, ``POST http://host:port/path HTTP/1.1``): forwarded to the target in
  origin-form without the proxy's own headers, the answers copied back byte for byte as they come. A client
  connection is tied to the target of its first request (loadgen keeps one per origin).
- ``credentials`` (``user:password``): a request without that ``Proxy-Authorization: Basic`` gets ``407``.

``log`` holds every request line received, in order; ``upstream_ports`` the local port of every connection it
opened to a target, so that a target logging its peers' ports can tell which requests came through the proxy.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any
from urllib.parse import urlsplit

from tests.loop_server import LoopServer

HOP_BY_HOP = {"proxy-authorization", "proxy-connection", "keep-alive"}


class ProxyServer(LoopServer):
    name = "the proxy"

    def __init__(self, refuse_connect: bool = False, credentials: str | None = None) -> None:
        super().__init__()
        self.refuse_connect = refuse_connect
        self.expected = "Basic " + base64.b64encode(credentials.encode()).decode() if credentials else None
        self.log: list[str] = []
        self.authorizations: list[str | None] = []  # the Proxy-Authorization of each request line logged
        self.upstream_ports: set[int] = set()

    def url(self, userinfo: str = "") -> str:
        return f"http://{userinfo}127.0.0.1:{self.port}"

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: list[asyncio.StreamWriter] = []
        try:
            await self._serve(reader, writer, upstream)
        finally:
            for w in upstream:
                w.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     upstream: list[asyncio.StreamWriter]) -> None:
        """Request after request on one client connection, until it closes."""
        pipe: asyncio.Task[None] | None = None
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line, headers = _parse_head(head)
            self.log.append(line)
            self.authorizations.append(headers.get("proxy-authorization"))
            if self.expected is not None and headers.get("proxy-authorization") != self.expected:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic\r\n"
                             b"content-length: 0\r\nconnection: close\r\n\r\n")
                await writer.drain()
                return
            method, target, _ = line.split(" ", 2)
            if method == "CONNECT":
                await self._tunnel(target, reader, writer, upstream)
                return
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if pipe is None:  # the first request: connect to its target, copy every answer back
                origin = urlsplit(target)
                up_reader, _ = await self._open(origin.hostname, origin.port, upstream)
                pipe = asyncio.ensure_future(_copy(up_reader, writer))
            upstream[0].write(_origin_form(line, head) + body)
            await upstream[0].drain()

    async def _open(self, host: Any, port: Any, upstream: list[asyncio.StreamWriter]) -> \
            tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        up_reader, up_writer = await asyncio.open_connection(host, port)
        self.upstream_ports.add(up_writer.get_extra_info("sockname")[1])
        upstream.append(up_writer)
        return up_reader, up_writer

    async def _tunnel(self, authority: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      upstream: list[asyncio.StreamWriter]) -> None:
        if self.refuse_connect:
            writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
            return
        host, _, port = authority.rpartition(":")
        up_reader, up_writer = await self._open(host.strip("[]"), int(port), upstream)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for field in lines[1:]:
        if ":" in field:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def _origin_form(line: str, head: bytes) -> bytes:
    """The request head as the target gets it: its path only, without the proxy's headers."""
    method, target, version = line.split(" ", 2)
    parts = urlsplit(target)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    fields = [f for f in head.decode("latin-1").split("\r\n")[1:] if f and
              f.partition(":")[0].strip().lower() not in HOP_BY_HOP]
    return (f"{method} {path} {version}\r\n" + "".join(f + "\r\n" for f in fields) + "\r\n").encode("latin-1")


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes as they come, until the reading side closes; then the writing side is closed too."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
