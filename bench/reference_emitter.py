"""A reference SSE emitter for bench/fidelity.py: every stream gets its first token TTFT after the request
arrived and then one token every ITL; each write's true time is logged, so a client's measurement error can
be computed exactly. Serves /v1/models, /tokenize (1 token per word) and streaming chat completions.

    python bench/reference_emitter.py --ttft-ms 100 --itl-ms 20 --log writes.json
    python bench/reference_emitter.py --tls-cert server.pem --log writes.json      # https (cert + key in one PEM)

With TLS a write's logged time is taken just before the plaintext goes to the TLS layer (which encrypts and
writes at once), as loadgen stamps its own sends.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import socket
import ssl
import time

import h11

MODEL = "reference"


class Emitter(asyncio.Protocol):
    ids = itertools.count()

    def __init__(self, args: argparse.Namespace, log: dict[str, list[int]]) -> None:
        self.args, self.log = args, log
        self.conn = h11.Connection(h11.SERVER)
        self.body = b""
        self.t_received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self.t_received = time.monotonic_ns()
        self.conn.receive_data(data)
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self.target, self.body = event.target, b""
            elif isinstance(event, h11.Data):
                self.body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self.route()
                return

    def send_json(self, obj: object) -> None:
        body = json.dumps(obj).encode()
        out = self.conn.send(h11.Response(status_code=200, headers=[("content-type", "application/json"),
                                                                    ("content-length", str(len(body)))]))
        out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
        self.transport.write(out)
        self.next_cycle()

    def next_cycle(self) -> None:
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()

    def route(self) -> None:
        if self.target == b"/v1/models":
            return self.send_json({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        body = json.loads(self.body or b"{}")
        if self.target == b"/tokenize":
            text = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
            return self.send_json({"count": len(text.split()), "tokens": []})
        n = body.get("max_tokens", 16)
        prompt = len(" ".join(m["content"] for m in body.get("messages", [])).split())
        if not body.get("stream"):
            return self.send_json({"id": "x", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": " a" * n}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}})
        self.stream(f"chatcmpl-{next(self.ids)}", n, prompt)

    def stream(self, rid: str, n: int, prompt: int) -> None:
        self.transport.write(self.conn.send(h11.Response(status_code=200, headers=[
            ("content-type", "text/event-stream")])))
        loop = asyncio.get_running_loop()
        times = self.log.setdefault(rid, [self.t_received])
        start_s = self.t_received / 1e9 - time.monotonic() + loop.time()  # the request's arrival in loop time
        for k in range(n):
            at = start_s + (self.args.ttft_ms + k * self.args.itl_ms) / 1e3
            loop.call_at(at, self.write_token, rid, k, n, prompt, times)

    def write_token(self, rid: str, k: int, n: int, prompt: int, times: list[int]) -> None:
        if self.transport.is_closing() or self.conn.our_state is not h11.SEND_BODY:
            return  # the client went away
        last = k == n - 1
        # hand-framed chunk (a fixed template): the emitter must stay cheap to keep up with the client
        data = (b'data: {"id":"%s","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" a"},'
                b'"finish_reason":%s}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                % (rid.encode(), b'"length"' if last else b"null", prompt, k + 1, prompt + k + 1))
        if last:
            data += b"data: [DONE]\n\n"
        framed = b"%x\r\n%s\r\n" % (len(data), data)
        if last:
            framed += b"0\r\n\r\n"
            self.conn.send(h11.Data(data=data))  # keep h11's state in step with what was written
            self.conn.send(h11.EndOfMessage())
        times.append(time.monotonic_ns())
        self.transport.write(framed)
        if last:
            self.next_cycle()


async def main(args: argparse.Namespace) -> None:
    log: dict[str, list[int]] = {}
    loop = asyncio.get_running_loop()
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert)
    server = await loop.create_server(lambda: Emitter(args, log), "127.0.0.1", args.port, backlog=4096, ssl=tls)
    print("listening", server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    with open(args.log, "w") as fh:
        json.dump(log, fh)


if __name__ == "__main__":
    import uvloop

    ap = argparse.ArgumentParser()
    ap.add_argument("--ttft-ms", type=float, default=100)
    ap.add_argument("--itl-ms", type=float, default=20)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--tls-cert", help="serve https with this PEM (certificate and private key)")
    uvloop.run(main(ap.parse_args()))
