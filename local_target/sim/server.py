"""Routes of the simulator's OpenAI-compatible API, and ``serve()`` to run it on a loop."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h11

from . import dialects
from . import more_apis
from . import openai_api as api
from .config import EngineConfig
from .engine import SimRequest
from .http import Connection
from .metrics import render
from .runtime import EngineRuntime
from .reasoning import PhasePlan, draw_plan
from .tokenizer import output_token
from .trace import TraceWriter


GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                              "/v1/embeddings"})


@dataclass
class StreamFaults:
    cut_at: int | None = None  # token index after which the connection is dropped
    malformed_at: int | None = None  # token index before which a malformed chunk is sent


class StreamSink:
    """Turns a request's emitted tokens into SSE writes on its connection (``max_chunk_tokens`` per chunk).

    A chunk never spans two phases (reasoning, a tool call's name, its arguments, the answer; ``reasoning.py``):
    the last token of a phase flushes what is pending, and a tool call's name goes whole in one delta once its
    last token is generated. With ``reasoning.mixed_boundary`` the last reasoning token is held and leaves with
    the first answer token, in one chunk carrying both."""

    def __init__(self, conn: Connection, app: "SimApp", prep: api.Prepared, request_id: str,
                 faults: StreamFaults, plan: PhasePlan | None = None) -> None:
        self.conn, self.app, self.prep, self.faults = conn, app, prep, faults
        self.plan = plan or api.NO_PLAN
        formatter = more_apis.FORMATTERS.get(prep.kind, api.ChunkFormatter)
        self.fmt = formatter(prep, request_id, int(time.time()), self.plan,
                             app.cfg.reasoning.field_for(app.cfg.engine), app.cfg.engine)
        self.max_chunk = app.cfg.max_chunk_tokens
        self.mixed = app.cfg.reasoning.mixed_boundary
        self.pending = 0

    def on_token(self, req: SimRequest, index: int) -> Callable[[], None] | None:
        """Format token ``index``'s bytes now; return the action that writes them at the step's end."""
        if index == 0 and self.app.cfg.prefix_caching:
            self.fmt.cached_tokens = req.cached_tokens
        out = self.fmt.start() if index == 0 else b""
        if self.faults.malformed_at == index:
            out += b'data: {"id": "broken", "choices": [{"delta":\n\n'
        self.pending += 1
        last = req.finish_reason is not None and index == req.generated - 1
        flushed = 0
        if last or self._flush_due(index):
            flushed, self.pending = self.pending, 0
            out += self._chunks(index - flushed + 1, index, self._finish_reason(req) if last else None)
        if last:
            out += self.fmt.final_usage(req.generated) if self.prep.include_usage else b""
            out += self.fmt.done()
        cut = self.faults.cut_at == index and not last
        if not (out or last or cut):
            return None
        framed = self.conn.frame(out) if out else b""
        return lambda: self._deliver(req, framed, index - flushed + 1, flushed, last, cut)

    def _flush_due(self, index: int) -> bool:
        if not self.plan.active:  # the common case, kept as cheap as it was
            return self.pending >= self.max_chunk
        phase, after = self.plan.phase(index), self.plan.phase(index + 1)
        if phase != after:
            return not (self.mixed and phase == "reasoning" and after == "answer")
        return phase != "name" and self.pending >= self.max_chunk

    def _finish_reason(self, req: SimRequest) -> str | None:
        if self.plan.tool is not None and self.plan.counts(req.generated)["tool_calls"]:
            return "tool_calls"
        return req.finish_reason

    def _chunks(self, first: int, last: int, finish_reason: str | None) -> bytes:
        """The events of tokens ``first..last``: one per phase among them (two in one chunk when mixed)."""
        if not self.plan.active:
            return self.fmt.content("".join(output_token(i) for i in range(first, last + 1)), finish_reason, last + 1)
        groups: list[tuple[str, int, int]] = []  # (phase, first index, last index)
        for i in range(first, last + 1):
            phase = self.plan.phase(i)
            if groups and groups[-1][0] == phase:
                groups[-1] = (phase, groups[-1][1], i)
            else:
                groups.append((phase, i, i))
        text = ["".join(self.plan.token_text(i) for i in range(a, b + 1)) for _, a, b in groups]
        if [g[0] for g in groups] == ["reasoning", "answer"] and hasattr(self.fmt, "mixed"):
            return self.fmt.mixed(text[0], text[1], finish_reason, last + 1)
        out = b""
        for k, (phase, _, b) in enumerate(groups):
            reason = finish_reason if k == len(groups) - 1 else None
            if phase == "name":
                assert self.plan.tool is not None
                out += self.fmt.tool_start(self.plan.tool.call_id, self.plan.tool.name, reason, b + 1)
            else:
                call = {"reasoning": self.fmt.reasoning, "answer": self.fmt.content, "args": self.fmt.tool_args}
                out += call[phase](text[k], reason, b + 1)
        return out

    def _deliver(self, req: SimRequest, framed: bytes, first: int, count: int, last: bool, cut: bool) -> None:
        t_write_ns = self.conn.write_framed(framed) if framed else 0
        if t_write_ns is None:
            self.app.runtime.abort(req)  # the client went away
            return
        if count:
            self.app.runtime.note_write(req, first, count, t_write_ns)
        if last:
            self.conn.end_stream()
        elif cut:
            self.app.runtime.abort(req, reason="disconnect")
            self.conn.abort()


class SimApp:
    def __init__(self, runtime: EngineRuntime) -> None:
        self.runtime = runtime
        self.cfg = runtime.cfg
        self.rng = random.Random(self.cfg.seed + 1)
        self.phase_rng = random.Random(self.cfg.seed + 2)  # reasoning lengths and tool calls (reasoning.py)
        self.net_rng = random.Random(self.cfg.seed + 3)  # faults.network_delay_rate: which requests are held
        self._ids = itertools.count(1)
        self.created = int(time.time())
        self.routes: dict[tuple[str, str], Callable[[Connection, h11.Request, bytes], None]] = {
            ("GET", "/health"): lambda c, r, b: c.send(200, b"", "text/plain"),
            ("GET", "/v1/models"): self._models,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/gpu/metrics"): lambda c, r, b: c.send(200, self.runtime.metrics.power.render(),
                                                            "text/plain; version=0.0.4; charset=utf-8"),
            ("POST", "/v1/chat/completions"): lambda c, r, b: self._generate("chat", c, r, b),
            ("POST", "/v1/completions"): lambda c, r, b: self._generate("completions", c, r, b),
            ("POST", "/v1/responses"): lambda c, r, b: self._generate("responses", c, r, b),
            ("POST", "/v1/messages"): lambda c, r, b: self._generate("messages", c, r, b),
            ("POST", "/v1/embeddings"): lambda c, r, b: self._generate("embeddings", c, r, b),
        }
        for path, handler in dialects.ROUTES[self.cfg.engine].items():
            self.routes[("POST", path)] = self._tokenizer(handler)
        self.paths = {path for _, path in self.routes}

    def dispatch(self, conn: Connection, request: h11.Request, body: bytes) -> None:
        """Answer ``request``; a generation request drawn for ``faults.network_delay_rate`` is held
        ``network_delay_ms`` first (a slow path in front of the server: nothing, headers included, happens
        before it is through, and its arrival is when it got through)."""
        delay_ms = self._network_delay_ms(request)
        if delay_ms:
            asyncio.get_running_loop().call_later(delay_ms / 1e3, self._through, conn, request, body)
        else:
            self._dispatch(conn, request, body)

    def _network_delay_ms(self, request: h11.Request) -> float:
        faults = self.cfg.faults
        if not (faults.network_delay_ms and faults.network_delay_rate) or request.method != b"POST":
            return 0.0
        if request.target.decode().split("?", 1)[0] not in GENERATION_PATHS:
            return 0.0
        return faults.network_delay_ms if self.net_rng.random() < faults.network_delay_rate else 0.0

    def _through(self, conn: Connection, request: h11.Request, body: bytes) -> None:
        if conn.transport is None:  # the client left while it was held
            return
        due_ns = conn.t_received_ns + int(self.cfg.faults.network_delay_ms * 1e6)
        while (now := time.monotonic_ns()) < due_ns:  # the loop's timer fires up to a millisecond early
            pass
        conn.network_delay_ms, conn.t_received_ns = (now - conn.t_received_ns) / 1e6, now
        self._dispatch(conn, request, body)

    def _dispatch(self, conn: Connection, request: h11.Request, body: bytes) -> None:
        method, path = request.method.decode(), request.target.decode().split("?", 1)[0]
        try:
            handler = self.routes.get((method, path))
            if handler is None:
                status = 405 if path in self.paths else 404
                raise api.ApiError(status, f"{method} {path} is not served here", "NotFoundError")
            handler(conn, request, body)
        except api.ApiError as exc:
            conn.send_json(exc.status, exc.body())
        except Exception as exc:  # a bug must not kill the connection loop; answer like a server would
            conn.send_json(500, api.ApiError(500, f"internal error: {exc!r}", "InternalServerError").body())

    def _models(self, conn: Connection, request: h11.Request, body: bytes) -> None:
        conn.send_json(200, {"object": "list", "data": [
            {"id": self.cfg.model, "object": "model", "created": self.created, "owned_by": "loadgen-sim",
             "max_model_len": self.cfg.max_model_len}]})

    def _metrics(self, conn: Connection, request: h11.Request, body: bytes) -> None:
        text = render(self.runtime.engine, self.runtime.metrics, self.cfg.model)
        conn.send(200, text, "text/plain; version=0.0.4; charset=utf-8")

    def _tokenizer(self, handler: dialects.Handler) -> Callable[[Connection, h11.Request, bytes], None]:
        return lambda conn, request, body: conn.send_json(200, handler(api.parse_body(body), self.cfg))

    def _generate(self, kind: str, conn: Connection, request: h11.Request, body: bytes) -> None:
        parsed = api.parse_body(body)
        prep = (more_apis.PREPARE[kind](parsed, self.cfg) if kind in more_apis.PREPARE
                else api.prepare(kind, parsed, self.cfg))  # type: ignore[arg-type]
        request_id = self._request_id(kind, request)
        self._inject_refusals(conn, request_id, prep)
        plan = self._plan(prep, request_id)
        req = SimRequest(request_id, prep.prompt_tokens, prep.max_tokens, self._stop_after(prep, plan),
                         tokens=prep.tokens if self.cfg.prefix_caching else None, plan=plan)
        if kind == "embeddings":
            answer = more_apis.embedding_response(prep, self.cfg.model, request_id)
            req.on_finish = lambda r, reason: conn.send_json(200, answer)
        elif prep.stream:
            sink = StreamSink(conn, self, prep, request_id, self._stream_faults(req.stop_after), plan)
            req.on_token = sink.on_token
            conn.start_stream()
        else:
            full = more_apis.full_response if kind in more_apis.FORMATTERS else api.full_response
            req.on_finish = lambda r, reason: conn.send_json(200, full(
                prep, request_id, self.created, plan or api.NO_PLAN, r.generated, reason,
                r.cached_tokens if self.cfg.prefix_caching else None,
                self.cfg.reasoning.field_for(self.cfg.engine), self.cfg.engine))
        conn.active = req
        self.runtime.submit(req, conn.t_received_ns, conn.network_delay_ms)

    def _request_id(self, kind: str, request: h11.Request) -> str:
        given = dict(request.headers).get(b"x-request-id")
        suffix = given.decode(errors="replace") if given else f"{next(self._ids):08d}"
        return {"chat": "chatcmpl-", "completions": "cmpl-"}.get(kind, f"{kind}-") + suffix

    def _plan(self, prep: api.Prepared, request_id: str) -> PhasePlan | None:
        """The request's reasoning and tool-call phases; None (draws nothing) when it asks for neither."""
        if prep.kind not in ("chat", "responses", "messages"):
            return None
        plan = draw_plan(prep.asks, self.phase_rng, self.cfg, prep.max_tokens, request_id)
        return plan if plan.active else None

    def _stop_after(self, prep: api.Prepared, plan: PhasePlan | None = None) -> int:
        """The output length: ``max_tokens`` under ``ignore_eos``, else the natural (answer) length drawn, after
        the reasoning; a tool call ends the output whatever ``ignore_eos`` says."""
        if plan is not None and plan.tool is not None:
            return plan.reasoning_tokens + plan.tool.tokens
        if prep.ignore_eos:
            return prep.max_tokens
        reasoning = plan.reasoning_tokens if plan is not None else 0
        return min(prep.max_tokens, max(prep.min_tokens, reasoning + self.runtime.natural_output_tokens()))

    def _inject_refusals(self, conn: Connection, request_id: str, prep: api.Prepared) -> None:
        """Raise the injected 500 or 429, if any, after writing it to the trace (``runtime.refused``)."""
        faults, error = self.cfg.faults, None
        if faults.error_rate and self.rng.random() < faults.error_rate:
            error = api.ApiError(500, "injected server error", "InternalServerError")
        elif faults.queue_429_over is not None and len(self.runtime.engine.waiting) > faults.queue_429_over:
            error = api.ApiError(429, "too many requests waiting", "RateLimitError", code="rate_limit_exceeded")
        if error is not None:
            self.runtime.refused(request_id, prep.prompt_tokens, prep.max_tokens, conn.t_received_ns,
                                 conn.network_delay_ms, error.status)
            raise error

    def _stream_faults(self, stop_after: int) -> StreamFaults:
        faults, out = self.cfg.faults, StreamFaults()
        if faults.disconnect_rate and self.rng.random() < faults.disconnect_rate:
            out.cut_at = self.rng.randrange(stop_after)
        if faults.malformed_rate and self.rng.random() < faults.malformed_rate:
            out.malformed_at = self.rng.randrange(stop_after)
        return out


class SimServer:
    """A running simulator: ``base_url`` (ends in /v1), ``runtime`` (engine, metrics, in-memory trace)."""

    def __init__(self, server: asyncio.Server, runtime: EngineRuntime, host: str, port: int) -> None:
        self.server, self.runtime, self.host, self.port = server, runtime, host, port
        self.base_url = f"http://{host}:{port}/v1"

    async def close(self) -> None:
        self.server.close()
        await self.runtime.stop()


async def serve(cfg: EngineConfig, host: str = "127.0.0.1", port: int = 0, trace_path: Path | None = None,
                keep_trace: bool = False) -> SimServer:
    trace = TraceWriter(trace_path, keep_in_memory=keep_trace) if (trace_path or keep_trace) else None
    runtime = EngineRuntime(cfg, trace)
    app = SimApp(runtime)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(app), host, port, backlog=4096)
    runtime.start()
    bound_port = server.sockets[0].getsockname()[1]
    return SimServer(server, runtime, host, bound_port)
