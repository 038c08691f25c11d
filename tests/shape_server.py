"""A server that answers the way real servers, proxies and gateways do, byte for byte, for the shape tests
(tests/test_shapes.py): on 127.0.0.1, in a thread of the test process, every response written raw.

The first path segment picks the shape: ``http://127.0.0.1:PORT/SHAPE/v1``. The preflight (``/v1/models``,
``/tokenize``, the one-token probe) is answered plainly unless the shape is about it; generation requests
(``max_tokens`` > 1) get the shape. Every generation request is logged (``log``): its headers, ``max_tokens``,
the id its answer carries, when it arrived and when its first content was written (``time.monotonic_ns``,
the clock loadgen stamps with), so a test can hold each record to its own response.

| shape | the generation answer |
| --- | --- |
| ``ok`` | chunked SSE, one token a chunk (``TOKEN_EVERY_S`` apart), usage, ``[DONE]`` |
| ``interim`` | ``100 Continue`` and ``103 Early Hints`` before the final 200 (RFC 9110 §15.2) |
| ``close`` | HTTP/1.0, no Content-Length, the body ends when the server closes (RFC 9112 §6.3 rule 8) |
| ``close11`` | HTTP/1.1 with ``Connection: close`` and no framing: the same |
| ``slow-first`` | the head at once, the first token ``SLOW_FIRST_S`` later (a long prefill) |
| ``role-then-slow`` | a role-only chunk at once, the first token ``SLOW_FIRST_S`` later |
| ``stall-mid`` | two tokens, then nothing for ``SLOW_FIRST_S``, then the rest |
| ``error-null`` | every chunk carries ``"error": null`` |
| ``error-reset`` | two tokens, an in-band error event, then a TCP reset |
| ``bom`` | a UTF-8 byte order mark before the first event |
| ``tool-calls`` | ``delta.tool_calls`` with the arguments streamed, no ``content`` |
| ``list-content`` | ``delta.content`` as a list of text parts |
| ``gzip`` | ``Content-Encoding: gzip`` although identity was asked, flushed per event |
| ``json-error-200`` | status 200 with a JSON error body (a gateway's quota error) |
| ``redirect-run`` | generation requests get ``307`` to the ``ok`` shape (the probe does not) |
| ``redirect-away`` | generation requests get ``307`` to ``ok`` on ``other`` (another origin) |
| ``redirect-bad`` | generation requests get ``307`` with a malformed Location (``BAD_LOCATION``) |
| ``redirect-301`` | every request, ``/models`` too, gets ``301`` to ``https://…/ok/v1/…`` |
| ``redirect-307`` | every request, ``/models`` too, gets ``307`` to the ``ok`` shape |
| ``models-noid`` | ``/v1/models`` lists entries without an ``id`` |
| ``echo-key`` | generation requests get 400 whose long message echoes the Authorization header (at ~300) |
| ``echo-key-2k`` | the same, the key at ~2,000 characters into the message |
| ``tokenize-fails`` | ``/tokenize`` answers ``TOKENIZE_OK`` calls after ``/v1/models``, then HTTP 500 |
| ``tokenize-reshaped`` | ``/tokenize`` answers ``TOKENIZE_OK`` calls after ``/v1/models``, then 200 without a count |
| ``fail`` | every generation request gets 500 with a message |
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import time
import zlib
from typing import Any

import h11

from tests.loop_server import LoopServer, read_request

TOKEN_EVERY_S = 0.004
SLOW_FIRST_S = 1.5
BAD_LOCATION = "http://[bad/x"  # the "redirect-bad" shape's Location: an IPv6 literal never closed
FAIL_COOKIE = "c00kie-5e55ion-7a9b"  # the "fail" shape's Set-Cookie value: never in a capture
TOKENIZE_OK = 3


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (RFC 9112 §7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def content_delta(rid: str, text: str) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}


def tail(rid: str, n: int, prompt: int = 8) -> bytes:
    return (event({"id": rid, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            + event({"id": rid, "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n}})
            + b"data: [DONE]\n\n")


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class ShapeServer(LoopServer):
    name = "the shape server"

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(ssl_context)
        self.log: list[dict[str, Any]] = []
        self.other: "ShapeServer | None" = None  # another origin, for redirect-away
        self._tokenize_calls = 0
        self._served = 0

    def url(self, shape: str, userinfo: str = "") -> str:
        return f"{'https' if self.ssl_context else 'http'}://{userinfo}127.0.0.1:{self.port}/{shape}/v1"

    def generation(self, shape: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.log if shape is None or e["shape"] == shape]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request, body = await read_request(conn, reader)
            if request is None:
                return
            t_received_ns = time.monotonic_ns()
            shape, _, rest = request.target.decode().lstrip("/").partition("/")
            headers = {k.decode(): v.decode() for k, v in request.headers}
            keep = await self._route(writer, shape, "/" + rest, body, headers, t_received_ns)
            if not keep:
                writer.close()
                return
            conn = h11.Connection(h11.SERVER)  # each response was written raw: a fresh parser per request

    # ---- routing ---------------------------------------------------------------------------------------
    async def _route(self, writer: asyncio.StreamWriter, shape: str, path: str, body: bytes,
                     headers: dict[str, str], t_received_ns: int) -> bool:
        if shape in ("redirect-301", "redirect-307"):
            status = 301 if shape == "redirect-301" else 307
            scheme = "https" if status == 301 else "http"
            return _write(writer, _head(status, {"location": f"{scheme}://127.0.0.1:{self.port}/ok{path}",
                                                 "content-length": "0"}))
        if path == "/v1/models":  # a run's first request: tokenize-fails counts from here
            self._tokenize_calls = 0
            data = [{"object": "model", "owned_by": "x"}] if shape == "models-noid" else [{"id": "m", "object": "model"}]
            return _json(writer, 200, {"object": "list", "data": data})
        if path == "/tokenize":
            return self._tokenize(writer, shape, body)
        if path not in ("/v1/chat/completions", "/v1/completions"):
            return _json(writer, 404, {"error": {"message": "not found"}})
        req = json.loads(body)
        if req.get("max_tokens", 16) <= 1:  # the preflight's probe
            return await self._shape(writer, "ok", req, headers, t_received_ns, log=False)
        return await self._shape(writer, shape, req, headers, t_received_ns)

    def _tokenize(self, writer: asyncio.StreamWriter, shape: str, body: bytes) -> bool:
        self._tokenize_calls += 1
        if shape == "tokenize-fails" and self._tokenize_calls > TOKENIZE_OK:
            return _json(writer, 500, {"error": {"message": "tokenizer crashed"}})
        if shape == "tokenize-reshaped" and self._tokenize_calls > TOKENIZE_OK:
            return _json(writer, 200, {"tokens": [1, 2, 3]})  # 200, but no count
        req = json.loads(body)
        text = " ".join(str(m.get("content")) for m in req.get("messages", [])) or req.get("prompt", "")
        return _json(writer, 200, {"count": len(text.split()) + 3})

    async def _shape(self, writer: asyncio.StreamWriter, shape: str, req: dict[str, Any], headers: dict[str, str],
                     t_received_ns: int, log: bool = True) -> bool:
        self._served += 1
        n = max(1, int(req.get("max_tokens", 16)))
        entry = {"shape": shape, "headers": headers, "max_tokens": n, "id": f"r{self._served}",
                 "t_received_ns": t_received_ns, "t_first_content_ns": None}
        if log:
            self.log.append(entry)
        handler = getattr(self, "_" + shape.replace("-", "_"), None)
        if handler is None:
            return _json(writer, 404, {"error": {"message": f"no shape {shape!r}"}})
        return await handler(writer, entry)

    async def _tokens(self, writer: asyncio.StreamWriter, entry: dict[str, Any], n: int,
                      frame: Any = chunk, make: Any = None) -> None:
        """n content chunks of one token each; the first's write time logged."""
        rid = entry["id"]
        for i in range(n):
            data = event(make(rid, i) if make else content_delta(rid, " t"))
            if entry["t_first_content_ns"] is None:
                entry["t_first_content_ns"] = time.monotonic_ns()
            writer.write(frame(data))
            await writer.drain()
            await asyncio.sleep(TOKEN_EVERY_S)

    # ---- the shapes --------------------------------------------------------------------------------------
    async def _ok(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        writer.write(SSE_HEAD + chunk(event({"id": e["id"], "choices": [{"index": 0, "delta": {"role": "assistant"}}]})))
        await self._tokens(writer, e, e["max_tokens"])
        writer.write(chunk(tail(e["id"], e["max_tokens"])) + chunk(b""))
        return True

    async def _interim(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.005)
        return await self._ok(writer, e)

    async def _close(self, writer: asyncio.StreamWriter, e: dict[str, Any], version: bytes = b"1.0") -> bool:
        extra = b"connection: close\r\n" if version == b"1.1" else b""
        writer.write(b"HTTP/%s 200 OK\r\ncontent-type: text/event-stream\r\n%s\r\n" % (version, extra))
        await self._tokens(writer, e, e["max_tokens"], frame=lambda d: d)
        writer.write(tail(e["id"], e["max_tokens"]))
        await writer.drain()
        return False  # the close ends the body

    async def _close11(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return await self._close(writer, e, b"1.1")

    async def _slow_first(self, writer: asyncio.StreamWriter, e: dict[str, Any], role: bool = False) -> bool:
        writer.write(SSE_HEAD)
        if role:
            writer.write(chunk(event({"id": e["id"], "choices": [{"index": 0, "delta": {"role": "assistant"}}]})))
        await writer.drain()
        await asyncio.sleep(SLOW_FIRST_S)
        await self._tokens(writer, e, e["max_tokens"])
        writer.write(chunk(tail(e["id"], e["max_tokens"])) + chunk(b""))
        return True

    async def _stall_mid(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        writer.write(SSE_HEAD)
        await self._tokens(writer, e, 2)
        await asyncio.sleep(SLOW_FIRST_S)
        await self._tokens(writer, e, e["max_tokens"] - 2)
        writer.write(chunk(tail(e["id"], e["max_tokens"])) + chunk(b""))
        return True

    async def _role_then_slow(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return await self._slow_first(writer, e, role=True)

    async def _error_null(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        writer.write(SSE_HEAD)
        await self._tokens(writer, e, e["max_tokens"], make=lambda rid, i: {**content_delta(rid, " t"), "error": None})
        writer.write(chunk(event({"id": e["id"], "choices": [], "error": None,
                                  "usage": {"prompt_tokens": 8, "completion_tokens": e["max_tokens"]}})
                           + b"data: [DONE]\n\n") + chunk(b""))
        return True

    async def _error_reset(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        writer.write(SSE_HEAD)
        await self._tokens(writer, e, 2)
        writer.write(chunk(event({"error": {"message": "CUDA error: an illegal memory access was encountered",
                                            "type": "InternalServerError", "code": 500}})))
        await writer.drain()
        await asyncio.sleep(0.25)  # the server dies a moment later (time enough to read the event on a busy machine)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close → RST
        writer.transport.abort()
        return False

    async def _bom(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        writer.write(SSE_HEAD + chunk(b"\xef\xbb\xbf"))
        await writer.drain()
        await self._tokens(writer, e, e["max_tokens"])
        writer.write(chunk(tail(e["id"], e["max_tokens"])) + chunk(b""))
        return True

    async def _tool_calls(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        def make(rid: str, i: int) -> dict[str, Any]:
            call: dict[str, Any] = {"index": 0, "function": {"arguments": ' "t'}}
            if i == 0:
                call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": ""}}
            return {"id": rid, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
        writer.write(SSE_HEAD + chunk(event({"id": e["id"], "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                                                  "content": None}}]})))
        await self._tokens(writer, e, e["max_tokens"], make=make)
        writer.write(chunk(tail(e["id"], e["max_tokens"])) + chunk(b""))
        return True

    async def _list_content(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        def make(rid: str, i: int) -> dict[str, Any]:
            return {"id": rid, "choices": [{"index": 0, "delta": {"content": [{"type": "text", "text": " t"}]}}]}
        writer.write(SSE_HEAD)
        await self._tokens(writer, e, e["max_tokens"], make=make)
        writer.write(chunk(tail(e["id"], e["max_tokens"])) + chunk(b""))
        return True

    async def _gzip(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        writer.write(SSE_HEAD.replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip\r\n\r\n"))
        await self._tokens(writer, e, e["max_tokens"], frame=lambda d: chunk(z.compress(d) + z.flush(zlib.Z_SYNC_FLUSH)))
        writer.write(chunk(z.compress(tail(e["id"], e["max_tokens"])) + z.flush()) + chunk(b""))
        return True

    async def _json_error_200(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return _json(writer, 200, {"error": {"message": "quota exceeded for this key", "type": "insufficient_quota"}})

    async def _redirect_run(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return _write(writer, _head(307, {"location": "/ok/v1/chat/completions", "content-length": "17"}) + b"moved temporarily")

    async def _redirect_away(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        assert self.other is not None
        location = f"http://127.0.0.1:{self.other.port}/ok/v1/chat/completions"
        return _write(writer, _head(307, {"location": location, "content-length": "0"}))

    async def _redirect_bad(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return _write(writer, _head(307, {"location": BAD_LOCATION, "content-length": "0"}))

    async def _echo_key(self, writer: asyncio.StreamWriter, e: dict[str, Any], pad: int = 270) -> bool:
        key = e["headers"].get("authorization", "").removeprefix("Bearer ")
        # the key from character 287 on: a cut at 300 (88e4717 cut there, then redacted) leaves its first 13
        message = "x" * pad + " invalid api key " + key + " for this deployment"
        return _json(writer, 400, {"error": {"message": message, "type": "invalid_request_error"}})

    async def _echo_key_2k(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return await self._echo_key(writer, e, pad=1970)  # across the core's cut at 2,000

    async def _tokenize_fails(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return await self._ok(writer, e)

    async def _fail(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        data = json.dumps({"error": {"message": "the model is not loaded", "code": 500}}).encode()
        return _write(writer, _head(500, {"content-type": "application/json", "content-length": str(len(data)),
                                          "set-cookie": f"session={FAIL_COOKIE}; Path=/"}) + data)


def _head(status: int, headers: dict[str, str]) -> bytes:
    reason = {200: "OK", 301: "Moved Permanently", 307: "Temporary Redirect", 400: "Bad Request",
              404: "Not Found", 500: "Internal Server Error"}.get(status, "X")
    return (f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + "\r\n").encode("latin-1")


def _write(writer: asyncio.StreamWriter, data: bytes) -> bool:
    writer.write(data)
    return True


def _json(writer: asyncio.StreamWriter, status: int, obj: Any) -> bool:
    data = json.dumps(obj).encode()
    return _write(writer, _head(status, {"content-type": "application/json", "content-length": str(len(data))}) + data)
