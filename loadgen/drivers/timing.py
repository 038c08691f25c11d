"""Waiting until a monotonic deadline, and what a transport exception means: the two things every driver on
asyncio does the same way."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import httpx

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


def error_kind(exc: httpx.HTTPError) -> tuple[str, str]:
    """(error_kind, message) of a request that failed in the transport."""
    if isinstance(exc, httpx.ConnectError):
        return "connect", f"cannot connect: {exc}"
    if isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)):
        return "protocol", f"connection broken: {type(exc).__name__}: {exc}"
    return "protocol", f"{type(exc).__name__}: {exc}"
