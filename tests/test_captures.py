"""``--capture`` files (run/guards.py ``Captures``; drivers/http_conn.py collects them) hold the response as a
person reads it: its heads as received, then its body de-chunked and decoded, so the redactor sees a key that
chunk-size lines split or a content coding hid; a capture longer than 64 KiB ends with the cut mark. And a
compressed body that ends before its stream's end fails the request (RFC 9112 §6.3 rule 8; RFC 9110 §8.4)."""

from __future__ import annotations

import asyncio
import gzip
import json
import secrets
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, strategies as st

from loadgen import api
from loadgen.core.secrets import CUT
from loadgen.drivers.http_conn import REDIRECTS, Connection, StreamContext
from loadgen.drivers.wire_capture import CAPTURE_BYTES
from loadgen.run.guards import Captures
from tests.shape_server import ShapeServer, chunk
from tests.test_properties import splits
from tests.test_properties_http import REQUEST, FakeTransport, responses

KEY_ENV = "LOADGEN_CAPTURE_TEST_KEY"
SCENARIO = f"""\
name: captures
target: {{base_url: embedded, api_key_env: {KEY_ENV}, ttft_timeout_s: 10}}
load: {{arrival: constant, rate_per_s: 20, requests: 3, duration_s: 5, drain_timeout_s: 5}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: fixed, value: 4}}}}]
"""
HEAD_401 = b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
LONG_HEAD = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"


def pieces(key: str, n: int = 4) -> set[str]:
    return {key[i:i + n] for i in range(len(key) - n + 1)}


def _key(e: dict[str, Any]) -> str:
    return e["headers"].get("authorization", "").removeprefix("Bearer ")


def _message(key: str) -> bytes:
    return json.dumps({"error": {"message": f"invalid api key {key} for this deployment", "type": "auth"}}).encode()


class EchoServer(ShapeServer):
    """The shape server with three more shapes, each answering generation requests with an error body that
    echoes the API key: ``echo-chunked`` (chunked, the key split across two chunks, each written alone),
    ``echo-gzip`` (gzip, by Content-Length) and ``echo-long`` (~70 KiB, the key across the 64 KiB cut)."""

    async def _echo_chunked(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        key, body = _key(e), _message(_key(e))
        middle = body.index(key.encode()) + len(key) // 2
        writer.write(HEAD_401 + b"transfer-encoding: chunked\r\n\r\n" + chunk(body[:middle]))
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(chunk(body[middle:]) + chunk(b""))
        return True

    async def _echo_gzip(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        data = gzip.compress(_message(_key(e)))
        writer.write(HEAD_401 + b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
        return True

    async def _echo_long(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        pad = CAPTURE_BYTES - len(LONG_HEAD) - len(" key ") - 6  # the cut lands 6 characters into the key
        body = b"x" * pad + b" key " + _key(e).encode() + b" tail " + b"y" * 8000
        writer.write(LONG_HEAD + b"".join(chunk(body[i:i + 4096]) for i in range(0, len(body), 4096)) + chunk(b""))
        return True


@pytest.fixture(scope="module")
def echo() -> Any:
    with EchoServer() as srv:
        yield srv


def _captures(echo: EchoServer, shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[str]]:
    key = "sk-" + secrets.token_urlsafe(24)
    monkeypatch.setenv(KEY_ENV, key)
    scenario = tmp_path / "captures.yaml"
    scenario.write_text(SCENARIO)
    result = api.run(scenario, base_url=echo.url(shape), out=tmp_path / "r", server_metrics=False, capture=2)
    files = sorted((result.run_dir / "captures").iterdir())
    assert [p.name[:4] for p in files] == ["001-", "002-"]
    texts = [p.read_bytes().decode("utf-8") for p in files]  # the CR LF of the heads as they came
    assert [_key(e) for e in echo.generation(shape)][-3:] == [key] * 3  # the key was sent (and echoed)
    return key, texts


@pytest.mark.parametrize("shape, coding", [("echo-chunked", "transfer-encoding: chunked"),
                                           ("echo-gzip", "content-encoding: gzip")])
def test_a_key_echoed_in_a_chunked_or_gzip_body_leaves_no_piece_in_the_capture(echo, tmp_path, monkeypatch,
                                                                                shape, coding):
    """On the wire the key is split by a chunk-size line (each half would pass the redactor) or compressed (it
    would pass whole, recoverable by decompressing the capture): the capture holds the decoded text, the key
    masked whole, the head as received."""
    key, texts = _captures(echo, shape, tmp_path, monkeypatch)
    for text in texts:
        assert not [p for p in pieces(key) if p in text], text
        assert "HTTP/1.1 401 Unauthorized\r\n" in text and coding in text  # the status line and headers
        assert "invalid api key *** for this deployment" in text  # decoded, the key masked whole
        assert "de-chunked and decoded" in text  # says what the body is


def test_a_capture_longer_than_64_kib_ends_with_the_cut_mark_and_no_piece_of_a_key_cut_there(echo, tmp_path,
                                                                                           monkeypatch):
    key, texts = _captures(echo, "echo-long", tmp_path, monkeypatch)
    for text in texts:
        assert text.endswith(f" key ***{CUT}"), text[-40:]  # the key's head left before the cut: masked
        assert not [p for p in pieces(key) if p in text] and " tail " not in text
        assert "HTTP/1.1 400 Bad Request\r\n" in text and "its first 64 KiB" in text


# ---- the capture, read by the connection (a stand-in transport) ---------------------------------------------
async def _read(reads: list[bytes], close: bool = False, capture: bool = True
                ) -> tuple[list[bytes], Exception | None, bytearray | None]:
    """One request's response delivered in ``reads`` (then a clean close): (what was fed, one item a feed, the
    error, the capture)."""
    conn, transport = Connection(("http", "h", 80)), FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    fed: list[bytes] = []
    ctx = StreamContext(feed=lambda data, _t_ns: fed.append(data), raw=bytearray() if capture else None)
    sent = asyncio.ensure_future(conn.send_bytes(REQUEST, ctx))
    await transport.written.wait()
    for data in reads:
        conn.data_received(data)
    if close:
        conn.connection_lost(None)
    try:
        await sent
        await conn.wait_done()
    except httpx.HTTPError as exc:
        return fed, exc, ctx.raw
    return fed, None, ctx.raw


def _heads(wire: bytes) -> bytes:
    """The heads of a response's bytes: interim ones, then the final one."""
    pos = 0
    while True:
        end = wire.index(b"\r\n\r\n", pos) + 4
        if not wire[pos:end].split()[1].startswith(b"1"):
            return wire[:end]
        pos = end


@given(st.data())
def test_a_capture_holds_the_heads_as_received_and_the_body_as_fed(data: st.DataObject) -> None:
    """Any response of the grammar (interim heads, framed by length, chunks or the close; gzip, deflate or
    identity), cut into reads anywhere: the capture is its heads byte for byte, then the body as fed."""
    response = data.draw(responses())
    reads = data.draw(splits(response.wire))
    fed, error, raw = asyncio.run(_read(reads, close=response.closes))
    assert error is None and b"".join(fed) == response.body
    assert bytes(raw or b"") == _heads(response.wire) + (b"" if response.status in REDIRECTS else response.body)


def test_a_head_that_does_not_parse_is_captured_as_it_came() -> None:
    wire = b"HTTP/1.1 200 OK\r\nbad header line\r\n\r\n"
    _, error, raw = asyncio.run(_read([wire]))
    assert isinstance(error, httpx.RemoteProtocolError) and bytes(raw or b"") == wire


def test_captures_count_only_the_files_written(tmp_path: Path) -> None:
    """A capture that cannot be written (here: its directory is a file) is not named as kept."""
    from loadgen.core.records import RequestRecord
    record = RequestRecord.__new__(RequestRecord)
    record.seq, record.class_name, record.error_kind, record.error_message = 1, "c", "http_4xx", "no"
    (tmp_path / "captures").write_text("in the way")
    captures = Captures(tmp_path, 2)
    captures(record, b"HTTP/1.1 401 Unauthorized\r\n\r\n")
    assert captures.written == []
    (tmp_path / "captures").unlink()
    captures(record, b"HTTP/1.1 401 Unauthorized\r\n\r\n")
    assert [p.name for p in captures.written] == ["002-seq1.txt"] and captures.written[0].is_file()


# ---- a compressed body that ends before its stream does ---------------------------------------------------
def _gzip_head(framing: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n" + framing + b"\r\n"


EVENTS = b"data: {\"a\": 1}\n\n" * 40 + b"data: [DONE]\n\n"
CUT_SHORT = gzip.compress(EVENTS, mtime=0)[:-8]  # all but the trailer (CRC-32, length: RFC 1952 §2.2)


@pytest.mark.parametrize("reads, close, error", [
    ([_gzip_head(b"connection: close\r\n") + CUT_SHORT], True, httpx.ReadError),  # the close ended it
    ([_gzip_head(b"content-length: %d\r\n" % len(CUT_SHORT)) + CUT_SHORT], False, httpx.DecodingError),
    ([_gzip_head(b"transfer-encoding: chunked\r\n") + chunk(CUT_SHORT) + chunk(b"")], False, httpx.DecodingError),
    ([_gzip_head(b"connection: close\r\n"), CUT_SHORT[:1]], True, httpx.ReadError),
])
def test_a_compressed_body_cut_short_fails_whatever_its_framing(reads, close, error) -> None:
    """The close (RFC 9112 §6.3 rule 8), a Content-Length or the last chunk ended the body before the gzip
    stream's end: the request fails (a truncated answer is not taken as whole)."""
    _, got, _ = asyncio.run(_read(reads, close=close, capture=False))
    assert isinstance(got, error) and "ended before its end" in str(got), got


@pytest.mark.parametrize("coding, encode", [(b"gzip", gzip.compress), (b"deflate", zlib.compress),
                                            (b"br", lambda b: pytest.importorskip("brotli").compress(b))])
def test_a_whole_compressed_body_closed_by_the_server_is_whole(coding, encode) -> None:
    payload = encode(EVENTS)
    head = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-encoding: %s\r\n\r\n" % coding
    fed, error, _ = asyncio.run(_read([head + payload[:7], payload[7:]], close=True))
    assert error is None and b"".join(fed) == EVENTS


def test_an_empty_body_with_a_coding_is_whole() -> None:
    fed, error, _ = asyncio.run(_read([_gzip_head(b"content-length: 0\r\n")]))
    assert error is None and fed == []


def test_a_brotli_read_that_decodes_to_more_than_32_kib_is_fed_at_once() -> None:
    """Google's brotli module (1.2), mid-stream, hands out ~32 KiB per ``process`` call and keeps the rest for
    calls with no input: a read's events were held back until the stream's end."""
    brotli = pytest.importorskip("brotli")
    body = b"".join(b"data: {\"i\": %d}\n\n" % i for i in range(20000))
    payload = brotli.compress(body)
    head = b"HTTP/1.1 200 OK\r\ncontent-encoding: br\r\ncontent-length: %d\r\n\r\n" % len(payload)
    half = len(payload) // 2
    fed, error, _ = asyncio.run(_read([head + payload[:half], payload[half:]], capture=False))
    assert error is None and b"".join(fed) == body and len(fed[0]) > 100_000
