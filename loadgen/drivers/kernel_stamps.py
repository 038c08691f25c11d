"""Read stamps taken by the kernel: when a read's bytes arrived, whatever the event loop was doing then.

A stamp taken in a protocol's ``data_received`` is late by however long the loop took to get there: the parsing of
the other sockets' reads that were ready in the same poll, a slow callback, a garbage collection. Linux stamps
every received packet as it enters the stack (``SO_TIMESTAMPNS``, socket(7): "the timestamp of the last packet
passed to the user" comes with ``recvmsg`` as an ``SCM_TIMESTAMPNS`` control message, a ``struct timespec`` of
CLOCK_REALTIME); ``stamped_socket.py`` reads with ``recvmsg`` and stamps each read with it, mapped here onto
CLOCK_MONOTONIC, the clock of every other stamp loadgen takes.

The mapping (``ClockMap``): offset = CLOCK_REALTIME − CLOCK_MONOTONIC, sampled by bracketing one realtime read
between two monotonic reads (the offset is taken at the bracket's midpoint; its error is at most half the
bracket's width), the narrowest of ``TRIES`` brackets kept, sampled again every ``REFRESH_NS`` (1 s) when a read
is mapped. Both clocks run at the same NTP-slewed rate (adjtimex(2) steers both); they part only when
CLOCK_REALTIME is stepped (settimeofday, an NTP step, a VM resume), and a step is caught at the next refresh: until
then stamps are off by the step. ``ClockMap`` keeps the widest bracket and the largest change of offset between
two refreshes it saw (``STATS``): the mapping's error is at most half the former plus the latter. A mapped stamp
later than the monotonic clock read just after the ``recvmsg`` is clamped to that read (counted: ``clamped``).

Where the kernel gives no stamp (not Linux, a kernel without the option, a read without the control message) the
read is stamped with ``time.monotonic_ns()`` just after ``recvmsg`` returns, counted as ``fallback``.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable

REFRESH_NS = 1_000_000_000  # the offset is sampled again after this long (a realtime step lasts at most this)
TRIES = 5  # brackets per sample; the narrowest is kept
SO_TIMESTAMPNS_NEW, SO_TIMESTAMPNS_OLD = 64, 35  # asm-generic/socket.h; the cmsg type is the option's number
_GENERIC_ABI = ("x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "armv7l", "riscv64", "ppc64le", "s390x")
ANC_BYTES = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0  # one timespec of two 64-bit fields
_TIMESPEC_NEW = struct.Struct("qq")  # struct __kernel_timespec
_TIMESPEC_OLD = struct.Struct("ll")  # struct timespec (native long)


@dataclass
class StampStats:
    """Counts over the process's stamped reads (``as_dict`` for a summary; LOADGEN_STAMP_STATS: written at exit)."""

    kernel: int = 0  # stamped with the kernel's receive time
    fallback: int = 0  # stamped with time.monotonic_ns() after recvmsg (no timestamp came)
    clamped: int = 0  # a kernel stamp mapped later than the read's return, set to that return
    body_reads: int = 0  # reads that carried some SSE event's end (``\n\n``), any transport
    multi_event_reads: int = 0  # of those, reads that carried more than one: their events share one stamp
    events: int = 0  # event ends in those reads
    max_bracket_ns: int = 0  # the widest bracket a kept offset sample had (its error: half of it)
    max_step_ns: int = 0  # the largest change of offset seen between two refreshes (drift or a step)
    refreshes: int = 0
    split_reads: int = 0  # reads that ended at an SSE event's end, taken one event at a time while the loop was late

    def reset(self) -> None:
        """Zero every count (a run's own figures: ``loadgen run`` resets them as it starts sending)."""
        for f in fields(self):
            setattr(self, f.name, f.default)

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = dict(asdict(self))
        out["reads"] = self.kernel + self.fallback  # reads with bytes, on connections read by stamped_socket.py
        out["multi_event_share"] = self.multi_event_reads / self.body_reads if self.body_reads else 0.0
        out["events_sharing_a_stamp_share"] = (self.events - (self.body_reads - self.multi_event_reads)) \
            / self.events if self.events else 0.0
        return out


STATS = StampStats()


def count_events(body: bytes) -> None:
    """One read's body bytes: how many SSE events ended in it (WHATWG HTML §9.2.6: an event ends at a blank line;
    ``\\n\\n`` is how the servers loadgen measures end them)."""
    n = body.count(b"\n\n")
    if n:
        STATS.body_reads += 1
        STATS.events += n
        if n > 1:
            STATS.multi_event_reads += 1


class ClockMap:
    """CLOCK_REALTIME instants onto CLOCK_MONOTONIC: ``monotonic = realtime − offset``."""

    def __init__(self, monotonic_ns: Callable[[], int] = time.monotonic_ns,
                 realtime_ns: Callable[[], int] = time.time_ns, refresh_ns: int = REFRESH_NS,
                 stats: StampStats | None = None) -> None:
        self._mono, self._real, self.refresh_ns = monotonic_ns, realtime_ns, refresh_ns
        self.stats = stats if stats is not None else STATS
        self.offset_ns, self.bracket_ns, self.sampled_ns = 0, 0, 0
        self.sampled = False

    def sample(self) -> None:
        """The offset from the narrowest of TRIES brackets (monotonic, realtime, monotonic)."""
        best: tuple[int, int, int] | None = None
        for _ in range(TRIES):
            m1 = self._mono()
            r = self._real()
            m2 = self._mono()
            if best is None or m2 - m1 < best[0]:
                best = (m2 - m1, r - (m1 + m2) // 2, m2)
        width_ns, offset_ns, at_ns = best  # type: ignore[misc] - TRIES >= 1
        if self.sampled:
            self.stats.max_step_ns = max(self.stats.max_step_ns, abs(offset_ns - self.offset_ns))
        self.offset_ns, self.bracket_ns, self.sampled_ns, self.sampled = offset_ns, width_ns, at_ns, True
        self.stats.max_bracket_ns = max(self.stats.max_bracket_ns, width_ns)
        self.stats.refreshes += 1

    def to_monotonic(self, realtime_ns: int, now_ns: int) -> int:
        """``realtime_ns`` on the monotonic clock; ``now_ns``: a monotonic read taken after the instant (the
        offset is refreshed when older than refresh_ns; a result after ``now_ns`` is clamped to it)."""
        if not self.sampled or now_ns - self.sampled_ns > self.refresh_ns:
            self.sample()
        t_ns = realtime_ns - self.offset_ns
        if t_ns > now_ns:
            self.stats.clamped += 1
            return now_ns
        return t_ns


CLOCK = ClockMap()


def supported() -> bool:
    """Whether this platform can stamp reads in the kernel (Linux with recvmsg and the generic socket ABI), and
    LOADGEN_READ_STAMPS is not ``loop`` (stamps taken in the loop's callback, as before: for comparisons)."""
    if os.environ.get("LOADGEN_READ_STAMPS", "kernel") == "loop":
        return False
    return sys.platform.startswith("linux") and hasattr(socket.socket, "recvmsg") and ANC_BYTES > 0 \
        and platform.machine().lower() in _GENERIC_ABI


def enable(sock: socket.socket) -> tuple[int, struct.Struct] | None:
    """Turns receive timestamps on for ``sock``: the control message's type and layout, or None (not here)."""
    if not supported():
        return None
    for option, layout in ((SO_TIMESTAMPNS_NEW, _TIMESPEC_NEW), (SO_TIMESTAMPNS_OLD, _TIMESPEC_OLD)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, 1)
        except OSError:  # SO_TIMESTAMPNS_NEW: Linux 5.1 and later
            continue
        return option, layout
    return None


def read_stamp(ancdata: list[tuple[int, int, bytes]], kind: tuple[int, struct.Struct] | None, now_ns: int) -> int:
    """A read's stamp on the monotonic clock: the kernel's, mapped, else ``now_ns`` (counted)."""
    stats = STATS
    if kind is not None:
        for level, ctype, data in ancdata:
            if ctype == kind[0] and level == socket.SOL_SOCKET and len(data) >= kind[1].size:
                sec, nsec = kind[1].unpack_from(data)
                stats.kernel += 1
                return CLOCK.to_monotonic(sec * 1_000_000_000 + nsec, now_ns)
    stats.fallback += 1
    return now_ns


def _dump_at_exit() -> None:
    path = os.environ.get("LOADGEN_STAMP_STATS")
    if path and (STATS.kernel or STATS.fallback or STATS.body_reads):
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), **STATS.as_dict()}) + "\n")


atexit.register(_dump_at_exit)
