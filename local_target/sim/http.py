"""HTTP/1.1 keep-alive server on a raw asyncio protocol, parsed by h11.

Why not an ASGI app or aiohttp: at a step's end the engine must put one chunk on every running stream's socket.
Here that is a direct ``transport.write`` from the engine loop, in the same loop iteration; a framework would wake
one handler task per stream first (see bench/sim_precision.py for the measured difference).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import TYPE_CHECKING, Any

import h11

if TYPE_CHECKING:
    from .engine import SimRequest
    from .server import SimApp

SSE_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]


class Connection(asyncio.Protocol):
    def __init__(self, app: "SimApp") -> None:
        self.app = app
        self.h11 = h11.Connection(h11.SERVER)
        self.transport: asyncio.Transport | None = None
        self.request: h11.Request | None = None
        self.body = bytearray()
        self.busy = False  # a request is being answered; further events wait
        self.active: "SimRequest | None" = None  # the engine request this connection is answering
        self.t_received_ns = 0  # when the current request's first bytes arrived (its arrival time)
        self.network_delay_ms = 0.0  # how long faults.network_delay_ms held it before that (server.py)

    # ---- asyncio callbacks ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.busy and self.h11.their_state is h11.IDLE:
            self.t_received_ns, self.network_delay_ms = time.monotonic_ns(), 0.0
        try:
            self.h11.receive_data(data)
        except h11.RemoteProtocolError:
            self._close()
            return
        self._process()

    def eof_received(self) -> bool | None:
        self.h11.receive_data(b"")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.active is not None:
            self.app.runtime.abort(self.active)
            self.active = None
        self.transport = None

    def _process(self) -> None:
        while not self.busy and self.transport is not None:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._protocol_error(exc)
                return
            if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return
            if isinstance(event, h11.Request):
                self.request, self.body = event, bytearray()
            elif isinstance(event, h11.Data):
                self.body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self.busy = True
                assert self.request is not None
                self.app.dispatch(self, self.request, bytes(self.body))

    def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.send_json(exc.error_status_hint, {"error": {"message": f"bad HTTP request: {exc}",
                                                             "type": "invalid_request_error",
                                                             "param": None, "code": None}})
        self._close()

    # ---- responses ------------------------------------------------------------------------------------
    def send(self, status: int, body: bytes, content_type: str) -> None:
        if self.transport is None:
            return
        headers = [("content-type", content_type), ("content-length", str(len(body)))]
        data = self.h11.send(h11.Response(status_code=status, headers=headers))
        data += self.h11.send(h11.Data(data=body)) + self.h11.send(h11.EndOfMessage())
        self.transport.write(data)
        self._next_cycle()

    def send_json(self, status: int, obj: Any) -> None:
        self.send(status, json.dumps(obj).encode(), "application/json")

    def start_stream(self) -> None:
        if self.transport is not None:
            self.transport.write(self.h11.send(h11.Response(status_code=200, headers=SSE_HEADERS)))

    def frame(self, data: bytes) -> bytes:
        """Body bytes framed for the wire (chunked encoding); write them later, in order, with ``write_framed``."""
        return self.h11.send(h11.Data(data=data)) or b""

    def write_framed(self, framed: bytes) -> int | None:
        """Write framed body bytes; return the write's time (taken just before the syscall: on loopback the
        peer may read the bytes before ``write`` returns), or None when the client is gone."""
        if self.transport is None or self.transport.is_closing():
            return None
        t_write_ns = time.monotonic_ns()
        self.transport.write(framed)
        return t_write_ns

    def end_stream(self) -> None:
        if self.transport is not None:
            self.transport.write(self.h11.send(h11.EndOfMessage()))
            self._next_cycle()

    def abort(self) -> None:
        """Cut the connection mid-response (fault injection): no terminating chunk, no [DONE]."""
        if self.transport is not None:
            self.transport.abort()

    def _next_cycle(self) -> None:
        self.active = None
        self.busy = False
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            self._process()
        elif self.h11.our_state in (h11.MUST_CLOSE, h11.CLOSED) or self.h11.their_state is h11.MUST_CLOSE:
            self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
