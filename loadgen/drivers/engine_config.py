"""The asyncio engine's configuration (what ``run/prepare.py`` derives from a scenario) and its running counts."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from loadgen.core import StreamTracker
from loadgen.core.records import RequestRecord


RECENT_TTFTS = 2048  # bounded: the progress line's TTFT median reads the last few seconds of these


@dataclass
class EngineStats:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0  # of the completed requests (as the server counted them, else as asked)
    t0_ns: int = 0
    cut_at_end: int = 0  # requests still in flight at the run's hard end (cancelled then)
    cpu_s: float = 0.0  # this process's CPU time while the engine ran (generator saturation check)
    wall_s: float = 0.0
    in_flight: dict[int, tuple[asyncio.Task[None], StreamTracker]] = field(default_factory=dict)
    # the latest completed requests' (monotonic end ns, TTFT ms from the intended send): run/progress.py's median
    recent_ttft_ms: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RECENT_TTFTS))

    def count(self, record: RequestRecord) -> None:
        """Count a request's end: cancelled, failed or completed, and its tokens; keep a completed one's TTFT."""
        if record.error_kind == "cancelled":
            self.cancelled += 1
        elif record.error_kind:
            self.failed += 1
        else:
            self.completed += 1
            self.prompt_tokens += record.prompt_tokens or record.prompt_tokens_asked
            if record.t_first_token_ns is not None:
                self.recent_ttft_ms.append((record.t_done_ns,
                                            (record.t_first_token_ns - record.t_intended_ns) / 1e6))
        self.output_tokens += record.output_tokens


@dataclass
class EngineConfig:
    url: str  # full URL of the completions endpoint
    headers: dict[str, str]
    ttft_timeout_s: float
    idle_timeout_s: float
    max_in_flight: int
    duration_s: float | None  # closed loop: stop sending after warmup + duration
    warmup_s: float
    concurrency: int | None
    send_ahead_ms: float = 0.0  # > 0 only with a transport that holds a request until its time (lean)
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 30.0  # after the last send; then what is in flight is cancelled
    max_event_bytes: int = 1 << 20
    max_rate_per_s: float | None = None  # closed loop: this process's users together, at most (RateCeiling)
    api: str = "chat"  # target.api: how the answers are parsed (core/apis.py)
    follow_redirects: bool = False  # target.follow_redirects: follow 307/308 (drivers/redirects.py)
