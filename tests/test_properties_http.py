"""Property tests (hypothesis) of the lean transport's response reading (drivers/http_conn.py ``Connection``,
content_coding.py): responses drawn from a grammar of what servers and proxies send, cut into reads anywhere,
fed to the protocol without sockets (a stand-in transport; ``connection_made``, ``data_received``,
``eof_received``/``connection_lost`` as asyncio calls them). The body the request's ``StreamContext.feed`` gets
is the server's, byte for byte."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from dataclasses import dataclass
from typing import Callable

from hypothesis import given, strategies as st

from loadgen.drivers.http_conn import REDIRECTS, Connection, StreamContext
from tests.test_properties import splits

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\n{}"
INTERIM = [b"HTTP/1.1 100 Continue\r\n\r\n",
           b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n"
           b"Link: </a.js>; rel=preload\r\n\r\n"]
REASONS = {200: b"OK", 307: b"Temporary Redirect", 404: b"Not Found", 429: b"Too Many Requests",
           500: b"Internal Server Error", 503: b"Service Unavailable"}


def _raw_deflate(data: bytes) -> bytes:
    coder = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return coder.compress(data) + coder.flush()


CODINGS: list[tuple[bytes | None, Callable[[bytes], bytes]]] = [  # (Content-Encoding, how the body is coded)
    (None, bytes), (b"identity", bytes), (b"gzip", lambda b: gzip.compress(b, mtime=0)),
    (b"x-gzip", gzip.compress), (b"deflate", zlib.compress), (b"deflate", _raw_deflate)]
SSE_BODY = st.lists(st.sampled_from([  # events, and bytes that look like HTTP framing inside a body
    b"data: {\"a\": 1}\n\n", b": ping\n\n", b"data: \xc3\xa9\xe6\x9d\xb1\n\n", b"data: [DONE]\n\n", b"0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n"]), max_size=6).map(b"".join)


@dataclass
class Response:
    wire: bytes  # as the server sends it, interim responses included
    body: bytes  # what the request's feed must get
    status: int  # the final response's
    closes: bool  # its body ends when the server closes the connection


@st.composite
def chunked(draw, payload: bytes) -> bytes:
    """RFC 9112 §7.1: chunks of random sizes (hex in either case, leading zeros), chunk extensions, the last
    chunk and trailer fields."""
    cuts = sorted(set(draw(st.lists(st.integers(1, len(payload) - 1), max_size=4)))) if len(payload) > 1 else []
    out = b""
    ext = st.sampled_from([b"", b"", b";x=1", b';name="a quoted; value"', b";flag"])
    for a, b in zip([0, *cuts], [*cuts, len(payload)]) if payload else ():
        size = b"%x" % (b - a)
        size = draw(st.sampled_from([size, size.upper(), b"00" + size]))
        out += size + draw(ext) + b"\r\n" + payload[a:b] + b"\r\n"
    trailers = draw(st.lists(st.sampled_from([b"X-Usage: 12\r\n", b"Server-Timing: gen;dur=53\r\n"]), max_size=2))
    return out + b"0" + draw(ext) + b"\r\n" + b"".join(trailers) + b"\r\n"


@st.composite
def responses(draw, keep_alive: bool = False) -> Response:
    """A response as servers frame it: by Content-Length, chunked coding, or the connection's close (HTTP/1.0,
    or 1.1 with ``Connection: close`` and no length: RFC 9112 §6.3); content-coded or not (gzip, deflate in
    zlib's wrapping or raw: RFC 9110 §8.4.1); after
    0 to 3 interim responses (RFC 9110 §15.2) on HTTP/1.1."""
    framing = draw(st.sampled_from(["length", "chunked"] + ([] if keep_alive else ["close-1.0", "close-1.1"])))
    status = draw(st.sampled_from([200, 200, 200, 307, 404, 429, 500, 503]))
    body = draw(SSE_BODY | st.binary(max_size=300))
    coding, encode = draw(st.sampled_from(CODINGS))
    payload = encode(body)
    fields = [(b"Content-Type", b"text/event-stream"), (b"Cache-Control", b"no-cache")]
    fields += [(b"Content-Encoding", coding)] if coding else []
    fields += [(b"Location", b"/v1/elsewhere")] if status in REDIRECTS else []
    if framing == "length":
        fields.append((b"Content-Length", b"%d" % len(payload)))
    elif framing == "chunked":
        fields.append((b"Transfer-Encoding", b"chunked"))
        payload = draw(chunked(payload))
    elif framing == "close-1.1":
        fields.append((b"Connection", b"close"))
    fields = [(k.lower() if draw(st.booleans()) else k, v) for k, v in draw(st.permutations(fields))]
    version = b"HTTP/1.0" if framing == "close-1.0" else b"HTTP/1.1"
    interim = b"" if framing == "close-1.0" else b"".join(draw(st.lists(st.sampled_from(INTERIM), max_size=3)))
    head = b"%s %d %s\r\n" % (version, status, REASONS[status]) + b"".join(b"%s: %s\r\n" % f for f in fields)
    return Response(interim + head + b"\r\n" + payload, b"" if status in REDIRECTS else body, status,
                    framing.startswith("close"))


class FakeTransport:
    """What the protocol calls on its transport; ``written`` says the request went out."""

    def __init__(self) -> None:
        self.written = asyncio.Event()
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)
        self.written.set()

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def get_extra_info(self, name: str, default=None):
        return default


@dataclass
class Exchange:
    status: int
    fed: list[bytes]  # one entry per feed call
    location: str | None


async def _exchange(conn: Connection, transport: FakeTransport, response: Response, reads: list[bytes]) -> Exchange:
    """One request and its response, delivered in ``reads``; the connection closes after them when the
    response's body is delimited by the close."""
    fed: list[bytes] = []
    ctx = StreamContext(feed=lambda data, _t_ns: fed.append(data))
    transport.written.clear()
    sent = asyncio.ensure_future(conn.send_bytes(REQUEST, ctx))
    await transport.written.wait()
    for data in reads:
        conn.data_received(data)
    if response.closes:
        conn.eof_received()
        conn.connection_lost(None)
    status, _ = await sent
    await conn.wait_done()
    return Exchange(status, fed, ctx.location)


def _connect() -> tuple[Connection, FakeTransport]:
    conn, transport = Connection(("http", "h", 80)), FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def _check(got: Exchange, response: Response, reads: list[bytes]) -> None:
    assert got.status == response.status
    assert b"".join(got.fed) == response.body
    assert len(got.fed) <= len(reads)  # at most one feed per read, never one per HTTP chunk
    assert got.location == ("/v1/elsewhere" if response.status in REDIRECTS else None)


@given(st.data())
def test_any_response_cut_anywhere_feeds_exactly_its_body(data: st.DataObject) -> None:
    """Interim responses skipped (RFC 9110 §15.2), the body framed by length, chunks or the close (RFC 9112
    §6.3, §7.1) and decoded (RFC 9110 §8.4): the feed gets the body exactly, the status is the final one, and
    the connection is reused unless the close delimited the body."""
    response = data.draw(responses())
    reads = data.draw(splits(response.wire))

    async def run() -> None:
        conn, transport = _connect()
        _check(await _exchange(conn, transport, response, reads), response, reads)
        assert conn.error is None and conn.reusable() == (not response.closes)
        assert transport.sent == [REQUEST]
    asyncio.run(run())


@given(st.data())
def test_two_responses_on_one_kept_alive_connection_never_mix(data: st.DataObject) -> None:
    """Requests in a row on one connection: each request's feed gets its own response's body, nothing of
    the other's (RFC 9112 §9.3: a persistent connection carries one request and its response after another)."""
    first, second = data.draw(responses(keep_alive=True)), data.draw(responses(keep_alive=True))
    first_reads, second_reads = data.draw(splits(first.wire)), data.draw(splits(second.wire))

    async def run() -> None:
        conn, transport = _connect()
        one = await _exchange(conn, transport, first, first_reads)
        assert conn.reusable()
        two = await _exchange(conn, transport, second, second_reads)
        _check(one, first, first_reads)
        _check(two, second, second_reads)
        assert transport.sent == [REQUEST, REQUEST]
    asyncio.run(run())


def test_raw_deflate_whose_first_byte_comes_alone_is_decoded() -> None:
    """Found by test_any_response_cut_anywhere_feeds_exactly_its_body: ``deflate`` sent raw (no zlib wrapper,
    as some servers do) failed to decode when a read ended one byte into the body, too early to tell the two
    formats apart (RFC 9110 §8.4.1.2)."""
    body = b"data: {\"a\": 1}\n\n"
    payload = _raw_deflate(body)
    wire = b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload
    response, cut = Response(wire, body, 200, closes=False), len(wire) - len(payload) + 1
    reads = [wire[:cut], wire[cut:]]

    async def run() -> None:
        conn, transport = _connect()
        _check(await _exchange(conn, transport, response, reads), response, reads)
    asyncio.run(run())
