"""The lean transport's direct POST path: the request head it prepares once a run, and when it steps aside; a
pooled connection the server closed for idleness."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import httpx
import pytest

from loadgen.drivers.errors import ClosedIdle
from loadgen.drivers.lean_transport import LeanTransport, StreamContext
from loadgen.drivers.streamed_post import direct_post


def test_a_prepared_post_is_a_well_formed_http_request():
    post = LeanTransport().prepare_post("http://127.0.0.1:8123/v1/chat/completions?x=1",
                                        {"authorization": "Bearer k", "User-Agent": "mine", "content-type": "application/json"})
    assert post.origin == ("http", "127.0.0.1", 8123)
    raw = post.request(b'{"a": 1}')
    head, body = raw.split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions?x=1 HTTP/1.1" and body == b'{"a": 1}'
    fields = [tuple(line.split(b": ", 1)) for line in lines[1:]]
    names = [k.lower() for k, _ in fields]
    assert (b"host", b"127.0.0.1:8123") in fields and (b"content-length", b"8") in fields
    assert names.count(b"user-agent") == 1 and (b"User-Agent", b"mine") in fields  # the scenario's wins
    assert len(names) == len(set(names))
    assert LeanTransport().prepare_post("https://h.example/v1/x", {}).origin == ("https", "h.example", 443)


def test_the_direct_path_steps_aside_for_another_transport_or_a_bad_header():
    lean = httpx.AsyncClient(transport=LeanTransport())
    assert direct_post(lean, "http://127.0.0.1:9/v1/x", {"a": "b"}) is not None
    assert direct_post(lean, "http://127.0.0.1:9/v1/x", {"a": "b\r\nInjected: 1"}) is None  # h11 refuses it
    assert direct_post(httpx.AsyncClient(), "http://127.0.0.1:9/v1/x", {}) is None


class IdleCloser:
    """A keep-alive server on 127.0.0.1 that answers each connection's first request and closes the connection
    when the second one arrives, without a byte of answer: the idle-timeout race a pooled connection meets
    (cpp-httplib, which llama-server uses, and uvicorn close keep-alive connections idle for 5 s)."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []  # the request lines, as they came
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        for answered in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), b"0"))
            await reader.readexactly(length)
            self.requests.append(head.split(b"\r\n")[0])
            if answered:
                break
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n"
                         b'{"ok": 1}')
            await writer.drain()
        writer.close()


async def _against_idle_closer(use: Callable[[int], Awaitable[object]]) -> tuple[IdleCloser, object]:
    closer = IdleCloser()
    server = await asyncio.start_server(closer.serve, "127.0.0.1", 0)
    try:
        return closer, await use(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


def test_a_read_only_call_on_a_connection_the_server_closed_is_retried_on_a_new_one():
    """/tokenize and /apply-template (post_bytes) and GETs are idempotent: the second call, whose pooled
    connection the server closes unanswered, is sent again on a new connection and answered (RFC 9112
    §9.3.1.1); before, `loadgen check` against llama-server failed with 'connection lost mid-response'."""
    async def two_posts(port: int) -> object:
        lean = LeanTransport()
        post = lean.prepare_post(f"http://127.0.0.1:{port}/tokenize", {})
        answers = [await lean.post_bytes(post, b"{}") for _ in range(2)]
        await lean.aclose()
        return answers

    async def two_gets(port: int) -> object:
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            return [(await client.get(f"http://127.0.0.1:{port}/v1/models")).json() for _ in range(2)]

    closer, answers = asyncio.run(_against_idle_closer(two_posts))
    assert answers == [(200, b'{"ok": 1}')] * 2
    assert closer.requests == [b"POST /tokenize HTTP/1.1"] * 3 and closer.connections == 2
    closer, answers = asyncio.run(_against_idle_closer(two_gets))
    assert answers == [{"ok": 1}] * 2 and closer.connections == 2


def test_a_generation_request_on_a_connection_the_server_closed_is_an_error_not_a_retry():
    """A streamed POST is not known to be idempotent (the server may have started generating): it fails as a
    read error naming the idle close, and is not sent twice."""
    async def two_streams(port: int) -> object:
        lean = LeanTransport()
        post = lean.prepare_post(f"http://127.0.0.1:{port}/v1/completions", {})
        first = await lean.post(post, b"{}", StreamContext(feed=lambda data, t_ns: None))
        with pytest.raises(ClosedIdle, match="closed an idle keep-alive connection") as raised:
            await lean.post(post, b"{}", StreamContext(feed=lambda data, t_ns: None))
        await lean.aclose()
        return first, raised.value

    closer, (first, error) = asyncio.run(_against_idle_closer(two_streams))  # type: ignore[misc]
    assert first == 200 and isinstance(error, httpx.ReadError) and len(closer.requests) == 2


def test_a_connection_idle_past_the_keepalive_expiry_is_not_reused():
    """Servers close idle connections (uvicorn and cpp-httplib at 5 s): the pool drops one idle for longer than
    its expiry (4 s by default; 0 here, so the pause between two requests is past it), so a generation request
    after a pause goes on a new connection and is answered, instead of meeting the server's close."""
    async def pause_then_stream(port: int) -> object:
        lean = LeanTransport(keepalive_expiry_s=0.0)
        post = lean.prepare_post(f"http://127.0.0.1:{port}/v1/completions", {})
        statuses = [await lean.post(post, b"{}", StreamContext(feed=lambda data, t_ns: None)) for _ in range(2)]
        await lean.aclose()
        return statuses

    closer, statuses = asyncio.run(_against_idle_closer(pause_then_stream))
    assert statuses == [200, 200] and closer.connections == 2 and len(closer.requests) == 2
