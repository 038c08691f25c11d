"""A misbehaving OpenAI-compatible server for the fault tests, on 127.0.0.1 in a thread of the test process.

The first path segment picks the behaviour, so one server serves every case: ``http://127.0.0.1:PORT/MODE/v1``.
The preflight (``/v1/models``, ``/tokenize``, the one-token probe) answers normally unless the mode is about it;
the generation requests (``max_tokens`` > 1) misbehave:

| mode | what it does |
| --- | --- |
| ``ok`` | streams ``max_tokens`` tokens, one every 5 ms, with usage and ``[DONE]`` (no ``/metrics``: 404) |
| ``silent-all`` | accepts every connection and reads the request, never answers anything (preflight included) |
| ``silent`` | answers the preflight; generation requests never get an answer |
| ``trickle`` | answers the preflight; then one token every 0.5 s, forever |
| ``endless-line`` | answers the preflight; then ``data: xxxx…`` without a newline, forever (64 KiB every 10 ms) |
| ``models-list`` | ``/v1/models`` answers a JSON list instead of ``{"data": [...]}`` |
| ``fail`` | answers the preflight; every generation request gets HTTP 500 |

Every request's headers are kept (``seen``) so tests can check what was sent. With ``ssl_context`` it serves
https (``url`` says so).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import h11

from tests.loop_server import LoopServer, read_request

TOKEN_EVERY_S = {"ok": 0.005, "trickle": 0.5}


class MisbehavingServer(LoopServer):
    name = "the misbehaving server"

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(ssl_context)
        self.seen: list[tuple[str, dict[str, str]]] = []

    def url(self, mode: str, userinfo: str = "") -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://{userinfo}127.0.0.1:{self.port}/{mode}/v1"

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request, body = await read_request(conn, reader)
            if request is None:
                return
            path = request.target.decode()
            self.seen.append((path, {k.decode(): v.decode() for k, v in request.headers}))
            mode, _, rest = path.lstrip("/").partition("/")
            await _route(conn, writer, mode, "/" + rest, body)
            if conn.our_state is not h11.DONE:
                return
            conn.start_next_cycle()


async def _route(conn: h11.Connection, writer: asyncio.StreamWriter, mode: str, path: str, body: bytes) -> None:
    if mode == "silent-all":
        await asyncio.Event().wait()
    if path == "/v1/models":
        models = [{"id": "m", "object": "model"}]
        return _json(conn, writer, 200, models if mode == "models-list" else {"object": "list", "data": models})
    if path == "/tokenize":
        req = json.loads(body)
        text = " ".join(m["content"] for m in req.get("messages", [])) or req.get("prompt", "")
        return _json(conn, writer, 200, {"count": len(text.split()) + 3})
    if path not in ("/v1/chat/completions", "/v1/completions"):
        return _json(conn, writer, 404, {"error": {"message": "not found"}})
    req = json.loads(body)
    if req.get("max_tokens", 16) <= 1 or mode in ("ok", "models-list"):  # the preflight's probe
        return await _stream(conn, writer, req, "ok")
    if mode == "fail":
        return _json(conn, writer, 500, {"error": {"message": "internal error", "code": 500}})
    if mode == "silent":
        await asyncio.Event().wait()
    await _stream(conn, writer, req, mode)


def _json(conn: h11.Connection, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    writer.write(conn.send(h11.Response(status_code=status, headers=[("content-type", "application/json"),
                                                                      ("content-length", str(len(data)))]))
                 + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _stream(conn: h11.Connection, writer: asyncio.StreamWriter, req: dict[str, Any], mode: str) -> None:
    writer.write(conn.send(h11.Response(status_code=200, headers=[("content-type", "text/event-stream")])))
    if not req.get("stream"):
        writer.write(conn.send(h11.Data(data=json.dumps({"usage": {"prompt_tokens": 8, "completion_tokens": 1},
                                                          "choices": [{"text": "x"}]}).encode())))
        writer.write(conn.send(h11.EndOfMessage()))
        return
    if mode == "endless-line":
        writer.write(conn.send(h11.Data(data=b"data: ")))
        while True:
            writer.write(conn.send(h11.Data(data=b"x" * 65536)))
            await writer.drain()
            await asyncio.sleep(0.01)
    tokens = max(1, int(req.get("max_tokens", 16)))
    n = 0
    while mode == "trickle" or n < tokens:
        n += 1
        writer.write(conn.send(h11.Data(data=_event({"id": "r", "choices": [{"index": 0, "delta": {"content": "x "}}],
                                                     "usage": {"prompt_tokens": 8, "completion_tokens": n}}))))
        await writer.drain()
        await asyncio.sleep(TOKEN_EVERY_S.get(mode, 0.005))
    writer.write(conn.send(h11.Data(data=_event({"id": "r", "choices": [{"index": 0, "delta": {},
                                                                         "finish_reason": "length"}],
                                                "usage": {"prompt_tokens": 8, "completion_tokens": n}})
                                    + b"data: [DONE]\n\n")))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
