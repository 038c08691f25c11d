"""A closed-loop user of the asyncio engine (``load.arrival: concurrency``): it sends the next request when its
last one ends. Its next body builds while the last request streams (a prompt counted by the server's
``/tokenize``, one in a sample: plan/prompt_model.py, then costs no wait), and the intended time is when the
body is ready and the rate ceiling lets it go. A conversation user (drivers/conversations.py) is one
conversation after another instead."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Protocol

from loadgen.drivers.sender import Sender
from loadgen.drivers.timing import sleep_until
from loadgen.plan.schedule import PlannedRequest

Ahead = tuple[PlannedRequest, "asyncio.Task[bytes | Exception]"]


class ClosedLoopEngine(Sender, Protocol):
    """What a closed-loop user needs of its engine (drivers/asyncio_engine.py)."""
    conversations: Any  # the plan's scheduler (drivers/schedulers.py), or None

    async def build(self, req: PlannedRequest) -> bytes | Exception:
        """``req``'s body, or what stopped it being built."""

    def spawn(self, req: PlannedRequest, t_intended_ns: int, body: bytes) -> asyncio.Task[None]:
        """Send ``req`` now, in a task of its own."""


async def closed_loop_user(e: ClosedLoopEngine) -> None:
    """One user, from the run's start until the plan's count is sent, its duration is over or the run stops."""
    end_ns = (e.stats.t0_ns + int((e.cfg.warmup_s + e.cfg.duration_s) * 1e9)
              if e.cfg.duration_s is not None else None)
    if e.conversations:  # the user is a conversation, then the next
        await sleep_until(e.stats.t0_ns, lambda: e.stopping)
        return await e.conversations.user(end_ns)
    ahead = _ahead(e)  # its first body builds before t0
    await sleep_until(e.stats.t0_ns, lambda: e.stopping)
    while ahead is not None and not e.stopping:
        req, building = ahead
        body = await building  # built while the user's last request streamed: no /tokenize wait here
        await e.ceiling.wait()
        now = time.monotonic_ns()  # the user is ready to send now: the intended time
        if end_ns is not None and now >= end_ns or e.stopping:
            break
        if isinstance(body, Exception):
            e.record_failure(req, now, body)
            ahead = _ahead(e)
            continue
        req = dataclasses.replace(req, t_intended_offset_ns=now - e.stats.t0_ns,
                                  warmup=now - e.stats.t0_ns < e.cfg.warmup_s * 1e9)
        sending = e.spawn(req, now, body)
        ahead = _ahead(e)  # queued after the send: the next body builds while this one streams
        await asyncio.gather(sending, return_exceptions=True)
    if ahead is not None:  # taken but not sent: the run ended first
        ahead[1].cancel()
        await asyncio.gather(ahead[1], return_exceptions=True)


def _ahead(e: ClosedLoopEngine) -> Ahead | None:
    """A user's next request, its body building from now on (None: the plan's count is sent)."""
    seq = e.next_seq()
    if e.plan.size is not None and seq >= e.plan.size:
        return None
    req = e.plan.request(seq)
    return req, asyncio.create_task(e.build(req))
