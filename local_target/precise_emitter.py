"""A reference SSE server for ``loadgen bench-client`` and bench/capacity.py, precise to microseconds up to
50,000 tokens/s: every stream's first token is written TTFT (plus an optional seeded spread) after its request
arrived, then one token every ITL, and each write's true time is logged, so a client's measurement error is
computed exactly.

    python -m local_target.precise_emitter --cpu 0 --ttft-ms 20 --itl-ms 5 --log writes.json

Standard library only, Linux only (``epoll``, CPU affinity); it never imports loadgen (loadgen starts it as a
child process). Once it listens it prints one line, ``listening PORT SCHEDULER``; it stops on SIGTERM or SIGINT
and then writes its log.

Why not asyncio: uvloop rounds timers to the millisecond, and asyncio's loop adds its own scheduling jitter.
This is one thread over ``epoll``: it waits in epoll (whose timeout is in whole milliseconds) until ``COARSE_US``
before the next write is due, then sleeps the rest with ``clock_nanosleep`` (``time.sleep``: nanosecond
resolution; the thread's timer slack is set to 1 ns) and writes every token that is due. It does not spin: under
SCHED_FIFO a spinning thread is throttled by the kernel (``sched_rt_runtime_us``: 50 ms of every second), which
measured 36 ms of lateness at p99. It pins itself to ``--cpu`` and asks for real-time priority (SCHED_FIFO)
where the system allows it (root, or CAP_SYS_NICE), and says whether it got it. Writes are hand-framed SSE
chunks of a fixed template, sent with one ``send`` each.

Its own precision is part of its output: for every write, the lateness (actual write − scheduled time) is
measured and summarised (median, p99, p99.9, max) in the log under ``"__emitter__"``, with the writes per second
it sustained. Serves ``GET /v1/models``, ``POST /tokenize`` (one token per word) and streaming or plain
``POST /v1/chat/completions``; anything else is a 404 (loadgen then skips the server's metrics). HTTP/1.1 with
keep-alive; requests must carry Content-Length (loadgen's do).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import random
import select
import signal
import socket
import time

COARSE_US = 1200  # wait in epoll (ms resolution) until this close to the next write, then nanosleep
MODEL = "reference"
CHUNK = (b'data: {"id":"%s","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" a"},'
         b'"finish_reason":%s}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n')


class Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "busy")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.inbuf, self.outbuf, self.busy = sock, b"", b"", False


class Emitter:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ttft_ns, self.itl_ns = int(args.ttft_ms * 1e6), int(args.itl_ms * 1e6)
        self.spread_ns, self.rng = int(args.ttft_spread_ms * 1e6), random.Random(args.seed)
        self.ep = select.epoll()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", args.port))
        self.listener.listen(4096)
        self.listener.setblocking(False)
        self.ep.register(self.listener.fileno(), select.EPOLLIN)
        self.conns: dict[int, Conn] = {}
        self.heap: list[tuple[int, int, Conn, bytes, int, int, int]] = []  # (due, tie, conn, rid, k, n, prompt)
        self.tie = itertools.count()
        self.ids = itertools.count()
        self.log: dict[str, list[int]] = {}
        self.lateness_ns: list[int] = []
        self.stop = False

    # ---- the loop ---------------------------------------------------------------------------------------
    def run(self) -> None:
        coarse_ns = COARSE_US * 1000
        while not self.stop:
            wait_ns = self.heap[0][0] - time.monotonic_ns() if self.heap else 50_000_000
            if wait_ns > coarse_ns:  # epoll's timeout is in whole ms (rounded up): wake early, then sleep the rest
                events = self.ep.poll((wait_ns - coarse_ns) / 1e9)
            else:
                if wait_ns > 0:
                    time.sleep(wait_ns / 1e9)  # clock_nanosleep: ns resolution, slack set to 1 ns
                events = self.ep.poll(0)
            for fd, mask in events:
                self.on_event(fd, mask)
            self.write_due()

    def write_due(self) -> None:
        heap = self.heap  # one entry per stream (its next token), so the heap stays as small as the streams
        while heap and heap[0][0] <= time.monotonic_ns():
            due, tie, conn, rid, k, n, prompt = heap[0]
            self.write_token(conn, due, rid, k, n, prompt)
            if k + 1 < n:
                heapq.heapreplace(heap, (due + self.itl_ns, tie, conn, rid, k + 1, n, prompt))
            else:
                heapq.heappop(heap)

    def on_event(self, fd: int, mask: int) -> None:
        if fd == self.listener.fileno():
            return self.accept()
        conn = self.conns.get(fd)
        if conn is None:
            return
        if mask & select.EPOLLOUT:
            self.flush(conn)
        if mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
            self.read(conn)

    def accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns[sock.fileno()] = Conn(sock)
            self.ep.register(sock.fileno(), select.EPOLLIN)

    def read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            return self.close(conn)
        t_received = time.monotonic_ns()
        conn.inbuf += data
        while True:
            head_end = conn.inbuf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = conn.inbuf[:head_end].decode("latin-1").split("\r\n")
            length = next((int(h.split(":", 1)[1]) for h in head[1:] if h.lower().startswith("content-length:")), 0)
            end = head_end + 4 + length
            if len(conn.inbuf) < end:
                return
            body, conn.inbuf = conn.inbuf[head_end + 4:end], conn.inbuf[end:]
            method, target = head[0].split(" ")[:2]
            self.route(conn, method, target, body, t_received)

    # ---- answers ----------------------------------------------------------------------------------------
    def route(self, conn: Conn, method: str, target: str, body: bytes, t_received: int) -> None:
        if method == "GET" and target == "/v1/models":
            return self.send_json(conn, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if method == "POST" and target == "/tokenize":
            req = json.loads(body or b"{}")
            text = req.get("prompt") or " ".join(m["content"] for m in req.get("messages", []))
            return self.send_json(conn, 200, {"count": len(text.split()), "tokens": []})
        if method != "POST" or target != "/v1/chat/completions":
            return self.send_json(conn, 404, {"error": {"message": f"no route {method} {target}"}})
        req = json.loads(body)
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        prompt = len(" ".join(m["content"] for m in req.get("messages", [])).split())
        if not req.get("stream"):
            return self.send_json(conn, 200, {"id": "x", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": " a" * n}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}})
        rid = f"chatcmpl-{next(self.ids)}"
        self.log[rid] = [t_received]
        self.send(conn, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        conn.busy = True
        first = t_received + self.ttft_ns + (self.rng.randrange(self.spread_ns) if self.spread_ns else 0)
        heapq.heappush(self.heap, (first, next(self.tie), conn, rid.encode(), 0, n, prompt))

    def write_token(self, conn: Conn, due: int, rid: bytes, k: int, n: int, prompt: int) -> None:
        if conn.sock.fileno() < 0:
            return  # the client went away
        last = k == n - 1
        data = CHUNK % (rid, b'"length"' if last else b"null", prompt, k + 1, prompt + k + 1)
        if last:
            data += b"data: [DONE]\n\n"
        framed = b"%x\r\n%s\r\n" % (len(data), data)
        if last:
            framed += b"0\r\n\r\n"
            conn.busy = False
        t = time.monotonic_ns()
        self.send(conn, framed)
        self.log[rid.decode()].append(t)
        self.lateness_ns.append(t - due)

    def send_json(self, conn: Conn, status: int, obj: object) -> None:
        body = json.dumps(obj).encode()
        reason = b"OK" if status == 200 else b"Not Found"
        self.send(conn, b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                  % (status, reason, len(body), body))

    def send(self, conn: Conn, data: bytes) -> None:
        if conn.outbuf:
            conn.outbuf += data
            return
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return self.close(conn)
        if sent < len(data):
            conn.outbuf = data[sent:]
            self.ep.modify(conn.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)

    def flush(self, conn: Conn) -> None:
        data, conn.outbuf = conn.outbuf, b""
        if data:
            self.send(conn, data)
        if not conn.outbuf and conn.sock.fileno() >= 0:
            self.ep.modify(conn.sock.fileno(), select.EPOLLIN)

    def close(self, conn: Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            self.conns.pop(fd, None)
            self.ep.unregister(fd)
            conn.sock.close()

    # ---- its own precision ------------------------------------------------------------------------------
    def report(self, started_ns: int, realtime: str) -> dict:
        late = sorted(self.lateness_ns)

        def q(p: float) -> float:
            return late[min(len(late) - 1, int(p * len(late)))] / 1e3 if late else float("nan")
        first = min((t[1] for t in self.log.values() if len(t) > 1), default=started_ns)
        busy_s = (max((t[-1] for t in self.log.values() if len(t) > 1), default=started_ns) - first) / 1e9
        return {"writes": len(late), "lateness_us": {"p50": q(0.5), "p99": q(0.99), "p999": q(0.999),
                                                     "max": late[-1] / 1e3 if late else None},
                "writes_per_s": len(late) / busy_s if busy_s > 0 else 0.0, "cpu": sorted(os.sched_getaffinity(0)),
                "scheduler": realtime}


def realtime_priority() -> str:
    """SCHED_FIFO where allowed, and a timer slack of 1 ns (the default 50 µs would round every short sleep)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "SCHED_FIFO"
    except (PermissionError, OSError) as exc:
        return f"SCHED_OTHER (SCHED_FIFO refused: {exc.strerror or exc})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ttft-ms", type=float, default=20)
    ap.add_argument("--itl-ms", type=float, default=5)
    ap.add_argument("--ttft-spread-ms", type=float, default=0.0,
                    help="add a uniform 0..SPREAD to each TTFT, so that a closed loop's streams do not tick in step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU (default: as started, e.g. by taskset)")
    ap.add_argument("--log", required=True, help="write {request id: [receipt, write, ...] ns} and __emitter__ here")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    sched = realtime_priority()
    em = Emitter(args)
    signal.signal(signal.SIGTERM, lambda *_: setattr(em, "stop", True))
    signal.signal(signal.SIGINT, lambda *_: setattr(em, "stop", True))
    print("listening", em.listener.getsockname()[1], sched, flush=True)
    started = time.monotonic_ns()
    em.run()
    with open(args.log, "w") as fh:
        json.dump({**em.log, "__emitter__": em.report(started, sched)}, fh)


if __name__ == "__main__":
    main()
