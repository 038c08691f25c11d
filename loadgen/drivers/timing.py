"""Time and faults, the same way for every driver on asyncio: waiting until a monotonic deadline, when a request
in flight is overdue, keeping the interpreter from pausing the loop, and what a transport exception means."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
from typing import Any, Callable, Iterator

import httpx

from loadgen.drivers.errors import FeedError, RedirectError
from loadgen.plan.workload import ServerFault

SPIN_MS = 1.0  # sleep until this long before a deadline, then yield to the loop until it passes


def _never() -> bool:
    return False


async def sleep_until(deadline_ns: int, stopping: Callable[[], bool] = _never) -> None:
    """Until ``time.monotonic_ns() >= deadline_ns`` (or ``stopping()``): a coarse sleep, then ``sleep(0)`` turns,
    so other streams keep being read while the wait ends within a loop turn of the deadline."""
    coarse_s = (deadline_ns - time.monotonic_ns()) / 1e9 - SPIN_MS / 1e3
    if coarse_s > 0:
        await asyncio.sleep(coarse_s)
    while time.monotonic_ns() < deadline_ns and not stopping():
        await asyncio.sleep(0)


def error_kind(exc: Exception) -> tuple[str, str]:
    """(error_kind, message) of a request that failed in the transport (anything but an httpx error there is
    loadgen's own fault: ``internal``, counted, the run goes on)."""
    if isinstance(exc, RedirectError):
        return "http_3xx", str(exc)
    if isinstance(exc, FeedError) or not isinstance(exc, httpx.HTTPError):
        return "internal", f"loadgen failed on this response (a bug; please report it): {type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.DecodingError):
        return "protocol", str(exc)
    if isinstance(exc, httpx.ConnectError):
        return "connect", f"cannot connect: {exc}"
    if isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)):
        return "protocol", f"connection broken: {type(exc).__name__}: {exc}"
    return "protocol", f"{type(exc).__name__}: {exc}"


def preparation_error(exc: Exception) -> tuple[str, str]:
    """(error_kind, message) of a request whose body could not be prepared: ``protocol`` when the server failed a
    step loadgen needed (``ServerFault``: /tokenize refused or answered in another shape mid-run), else
    ``internal`` (a bug in loadgen: counted, the run goes on, exit 4)."""
    kind = "protocol" if isinstance(exc, ServerFault) else "internal"
    return kind, f"the request could not be prepared: {type(exc).__name__}: {exc}"


def overdue(tracker: Any, cfg: Any, now: int) -> tuple[str, str] | None:
    """Why a request in flight (its ``StreamTracker``) must be cut now under ``cfg``'s timeouts (the engine's
    ``EngineConfig``), if it must: (error kind, message). Until the first token the TTFT deadline rules (a long
    prompt's prefill may take longer than the idle timeout, and a role-only chunk or a keep-alive comment is no
    token); from then on, the idle deadline applies between reads."""
    age_ns = now - tracker.t_sent_ns
    if tracker.broken:
        return "protocol", tracker.broken
    if not tracker.has_content():
        if age_ns > cfg.ttft_timeout_s * 1e9:
            return "timeout_ttft", f"no token within {cfg.ttft_timeout_s:g} s"
    elif now - tracker.last_read_ns > cfg.idle_timeout_s * 1e9:
        return "timeout_idle", f"no bytes for {cfg.idle_timeout_s:g} s"
    if age_ns > cfg.request_timeout_s * 1e9:
        return "timeout_request", f"not finished within {cfg.request_timeout_s:g} s (target.request_timeout_s)"
    return None


@contextlib.contextmanager
def quiet_runtime() -> Iterator[None]:
    """Keep the interpreter from pausing the loop mid-run. Automatic garbage collection is off while the run
    sends (a full collection stalled every stream for ~29 ms at 256 streams); records are freed by reference
    counting, and the few cycles (exceptions) are collected when the run ends. A thread writing Parquet hands
    the GIL back every 0.5 ms instead of 5 ms."""
    gc.collect()
    was_enabled, switch = gc.isenabled(), sys.getswitchinterval()
    gc.disable()
    sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(switch)
        if was_enabled:
            gc.enable()
        gc.collect()


class RateCeiling:
    """At most ``per_s`` sends a second across every closed-loop user of this process (``load.max_rate_per_s``,
    a worker's share of it under Locust): asyncio-throttle's sliding window of one send per ``1/per_s`` seconds,
    so sends are spaced, never bunched. The caller stamps a request's intended time *after* ``wait()``: a user
    held by the ceiling is the plan, not the generator's lag. ``per_s=None``: no ceiling."""

    def __init__(self, per_s: float | None) -> None:
        self.per_s = per_s
        self._throttler = None
        if per_s is not None:
            from asyncio_throttle import Throttler

            period_s = 1.0 / per_s
            # waiters poll; a poll every 1/20 of the spacing (0.5–10 ms) costs little and loses ≤ 5 % of the rate
            self._throttler = Throttler(rate_limit=1, period=period_s,
                                        retry_interval=min(0.01, max(0.0005, period_s / 20)))

    async def wait(self) -> None:
        if self._throttler is not None:
            await self._throttler.acquire()
