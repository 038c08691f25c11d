"""What one request's caller and the transport share: the ``StreamContext`` a request carries
(``extensions={CONTEXT_KEY: ctx}`` through httpx, or passed directly on the lean transport's own path)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

CONTEXT_KEY = "loadgen.stream"


@dataclass
class StreamContext:
    """Passed as ``extensions={CONTEXT_KEY: ctx}``; the transport fills ``t_sent_ns`` and calls ``feed``."""

    feed: Callable[[bytes, int], None] | None = None
    t_sent_ns: int = 0
    not_before_ns: int = 0  # hold the prepared request until this instant (the plan's send time)
    raw: bytearray | None = None  # --capture: each head as it came, then the body as fed (de-chunked, decoded)
    location: str | None = None  # a redirect's Location header, as sent
    http_version: str = ""  # of the final response ("1.1", "1.0")
    # the lean transport's: the connection the (last) request went out on took this long to open (TCP connect,
    # proxy tunnel, TLS handshake; 0: a pooled one), and the arrival of the read that completed the final
    # response's head (status line and headers, RFC 9112 §2.1). Another transport: connect_ns None, and
    # t_headers_ns when it handed the head over (streamed_post.py)
    connect_ns: int | None = None
    t_headers_ns: int | None = None
