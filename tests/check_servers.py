"""Servers that can or cannot be measured honestly, for ``loadgen check`` (tests/test_check.py): on 127.0.0.1,
in a thread of the test process, every response written raw. The first path segment picks the kind:
``http://127.0.0.1:PORT/KIND/v1``.

Every kind counts tokens by one rule (``count``: a word is a token, each chat message adds
``MESSAGE_TOKENS``, the generation prompt ``GEN_PROMPT_TOKENS``), answers vLLM's ``/tokenize`` by it, refuses
a prompt + max_tokens over ``MAX_MODEL_LEN`` with 400, and streams ``max_tokens`` tokens (finish_reason
``length``) ``TTFT_S`` after the request, ``ITL_S`` apart, with a role-only chunk in the first token's write:

| kind | what differs (the ground truth a check is held to) |
| --- | --- |
| ``clean`` | nothing; it also serves ``/metrics`` with vLLM's series |
| ``coalesce`` | ``COALESCE`` tokens per chunk, a chunk every ``COALESCE × ITL_S``; /models gives no max_model_len |
| ``cache`` | a prompt seen before is answered at once: the same text, the whole stream in one write |
| ``role-first`` | the role-only chunk at once, the first token ``ROLE_LEAD_S`` later |
| ``usage-lies`` | usage: completion_tokens ``LIE_FACTOR`` × the truth, prompt_tokens ``PROMPT_LIE`` over /tokenize's |
| ``no-usage`` | no usage event in the stream |
| ``early-length`` | ``max_tokens // EARLY_SHARE`` tokens, finish_reason ``length`` (a context limit), usage saying so |
| ``after-done`` | ``AFTER_DONE`` more content events after ``[DONE]`` |
| ``http10`` | answers streamed as HTTP/1.0, gzip-compressed, the body ending at the connection's close |

Each generation request is logged (``log``): its kind, max_tokens, when the first event and the first token
were written (``time.monotonic_ns``, the clock loadgen stamps with).
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from typing import Any

import h11

from tests.loop_server import LoopServer, read_request
from tests.shape_server import SSE_HEAD, _json, chunk, event

MAX_MODEL_LEN = 4096
TTFT_S = 0.02
ITL_S = 0.005
COALESCE = 4
ROLE_LEAD_S = 0.3
LIE_FACTOR = 3
EARLY_SHARE = 2
AFTER_DONE = 3
PROMPT_LIE = 40
MESSAGE_TOKENS = 3
GEN_PROMPT_TOKENS = 1
METRICS = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"


def count(body: dict[str, Any]) -> int:
    """The servers' tokenizer: a chat prompt (messages) or a plain one."""
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) + MESSAGE_TOKENS for m in body["messages"]) \
            + GEN_PROMPT_TOKENS
    return len(str(body.get("prompt", "")).split())


class CheckServer(LoopServer):
    name = "the check server"

    def __init__(self) -> None:
        super().__init__()
        self.log: list[dict[str, Any]] = []
        self._cache: dict[str, bool] = {}
        self._n = 0

    def url(self, kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/{kind}/v1"

    def generation(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.log if e["kind"] == kind]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request, body = await read_request(h11.Connection(h11.SERVER), reader)
            if request is None:
                return
            kind, _, path = request.target.decode().lstrip("/").partition("/")
            await self._route(writer, kind, "/" + path, json.loads(body) if body else {})
            await writer.drain()
            if kind == "http10" and path == "v1/chat/completions":  # RFC 9112 §6.3 rule 8: the close ends it
                writer.close()
                return

    async def _route(self, writer: asyncio.StreamWriter, kind: str, path: str, body: dict[str, Any]) -> None:
        if path == "/v1/models":
            entry: dict[str, Any] = {"id": "m", "object": "model"}
            if kind != "coalesce":
                entry["max_model_len"] = MAX_MODEL_LEN
            _json(writer, 200, {"object": "list", "data": [entry]})
        elif path == "/tokenize":
            _json(writer, 200, {"count": count(body), "max_model_len": MAX_MODEL_LEN})
        elif path == "/metrics" and kind == "clean":
            data = METRICS.encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(data), data))
        elif path == "/v1/chat/completions":
            await self._generate(writer, kind, body)
        else:
            _json(writer, 404, {"error": {"message": f"no {path} here"}})

    async def _generate(self, writer: asyncio.StreamWriter, kind: str, body: dict[str, Any]) -> None:
        n, prompt = int(body.get("max_tokens", 16)), count(body)
        if prompt + n > MAX_MODEL_LEN:
            _json(writer, 400, {"error": {"message": f"This model's maximum context length is {MAX_MODEL_LEN} "
                                          f"tokens. However, you requested {prompt + n} tokens."}})
            return
        self._n += 1
        e: dict[str, Any] = {"kind": kind, "id": f"r{self._n}", "max_tokens": n, "prompt_tokens": prompt,
                             "t_first_event_ns": None, "t_first_token_ns": None}
        if n > 1:
            self.log.append(e)
        key = json.dumps(body.get("messages"))
        if kind == "cache" and key in self._cache:
            writer.write(SSE_HEAD + chunk(self._whole(e, prompt)) + chunk(b""))
            return
        self._cache[key] = True
        frame = chunk
        if kind == "http10":  # every write a gzip member's flushed piece, no chunked framing
            gz = zlib.compressobj(wbits=31)
            frame = lambda data: gz.compress(data) + gz.flush(zlib.Z_SYNC_FLUSH) if data else gz.flush()  # noqa: E731
            writer.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n\r\n")
        else:
            writer.write(SSE_HEAD)
        role = event({"id": e["id"], "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        if kind == "role-first":
            self._stamp(e, "t_first_event_ns")
            writer.write(chunk(role))
            await writer.drain()
            await asyncio.sleep(ROLE_LEAD_S)
            role = b""
        else:
            await asyncio.sleep(TTFT_S)
        if kind == "early-length":
            e["streamed"] = n = max(1, n // EARLY_SHARE)
        await self._tokens(writer, e, n, COALESCE if kind == "coalesce" else 1, role, frame)
        late = b"".join(event({"id": e["id"], "choices": [{"index": 0, "delta": {"content": " late"}}]})
                        for _ in range(AFTER_DONE if kind == "after-done" else 0))
        writer.write(frame(self._tail(e, prompt, kind) + late) + frame(b""))

    async def _tokens(self, writer: asyncio.StreamWriter, e: dict[str, Any], n: int, per_chunk: int,
                      lead: bytes, frame: Any = chunk) -> None:
        for i in range(0, n, per_chunk):
            text = "".join(f" w{j}" for j in range(i, min(n, i + per_chunk)))
            self._stamp(e, "t_first_event_ns")
            self._stamp(e, "t_first_token_ns")
            writer.write(frame(lead + event({"id": e["id"], "choices": [{"index": 0, "delta": {"content": text}}]})))
            lead = b""
            await writer.drain()
            if i + per_chunk < n:
                await asyncio.sleep(ITL_S * per_chunk)

    @staticmethod
    def _stamp(e: dict[str, Any], key: str) -> None:
        if e[key] is None:
            e[key] = time.monotonic_ns()

    @staticmethod
    def _tail(e: dict[str, Any], prompt: int, kind: str) -> bytes:
        n = e.get("streamed", e["max_tokens"])
        usage = {"prompt_tokens": prompt + (PROMPT_LIE if kind == "usage-lies" else 0),
                 "completion_tokens": n * (LIE_FACTOR if kind == "usage-lies" else 1)}
        tail = event({"id": e["id"], "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if kind != "no-usage":
            tail += event({"id": e["id"], "choices": [], "usage": usage})
        return tail + b"data: [DONE]\n\n"

    def _whole(self, e: dict[str, Any], prompt: int) -> bytes:
        """A cached answer: every event at once."""
        self._stamp(e, "t_first_event_ns")
        self._stamp(e, "t_first_token_ns")
        out = event({"id": e["id"], "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(e["max_tokens"]):
            out += event({"id": e["id"], "choices": [{"index": 0, "delta": {"content": f" w{i}"}}]})
        return out + self._tail(e, prompt, "cache")
