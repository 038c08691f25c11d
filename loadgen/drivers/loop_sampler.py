"""loadgen's own health while a run goes: how late its event loop runs a timer, and how busy its process is.

A timer due every ``PERIOD_NS`` (50 ms) fires; how late it fired is ``loop_lag_ms`` at the instant it fired
(``t_ns``, ``time.monotonic_ns()``: the records' clock), so the loop was blocked over ``[t_ns − lag, t_ns]``
(a callback that held it, a collection, the CPU taken away). Each timer is due 50 ms after the previous one
fired, not on a fixed grid, so one long block is one sample, not a train of decreasing ones. uvloop rounds
timers to the millisecond (it may fire up to 1 ms early or late), so a lag is clamped at 0 and lags under
``KEEP_LAG_MS`` are the timer's own grain: such a sample is kept once a second only (a heartbeat: a second
without samples above it had no lag of 2 ms or more). ``cpu_busy_share`` is the process's CPU seconds
(``time.process_time``: every thread) over the wall seconds since the previous such sample, once a second and
when the sampler stops; it may exceed 1 with threads.

Bounded: a 24 h run blocked at every firing keeps 1.7 M lag rows + 86 k CPU rows, 17 bytes each in three
``array`` columns (≈ 31 MB); a healthy run keeps ≈ 2 rows a second. ``loadgen run`` (run/runner.py) runs it on
the engine's loop while the engine runs and writes the rows as client_metrics.parquet (records/client_metrics.py).
"""

from __future__ import annotations

import asyncio
import time
from array import array

PERIOD_NS = 50_000_000  # a timer due every 50 ms
KEEP_LAG_MS = 2.0  # a lag at least this large is always kept; smaller ones once a second
HEARTBEAT_NS = 1_000_000_000  # the smaller lags and the CPU share: once a second
SERIES = ("loop_lag_ms", "cpu_busy_share")  # the names, by their code in ``codes``
LOOP_LAG, CPU_BUSY = 0, 1


class LoopSampler:
    """The samples, as columns: ``t_ns`` (monotonic ns), ``codes`` (an index into SERIES), ``values``."""

    def __init__(self, period_ns: int = PERIOD_NS, keep_lag_ms: float = KEEP_LAG_MS,
                 heartbeat_ns: int = HEARTBEAT_NS) -> None:
        self.period_ns, self.keep_lag_ns, self.heartbeat_ns = period_ns, int(keep_lag_ms * 1e6), heartbeat_ns
        self.t_ns: array[int] = array("q")
        self.codes: array[int] = array("B")
        self.values: array[float] = array("d")
        self._cpu_ns, self._cpu_t_ns = 0, 0  # the process CPU time and wall time of the last CPU sample

    def __len__(self) -> int:
        return len(self.t_ns)

    def _add(self, t_ns: int, code: int, value: float) -> None:
        self.t_ns.append(t_ns)
        self.codes.append(code)
        self.values.append(value)

    def _cpu_sample(self, now_ns: int) -> None:
        cpu_ns = time.process_time_ns()
        if now_ns > self._cpu_t_ns:
            self._add(now_ns, CPU_BUSY, (cpu_ns - self._cpu_ns) / (now_ns - self._cpu_t_ns))
        self._cpu_ns, self._cpu_t_ns = cpu_ns, now_ns

    async def run(self) -> None:
        """Sample until cancelled (then one last CPU share, over the time since the previous one)."""
        now = time.monotonic_ns()
        self._cpu_ns, self._cpu_t_ns = time.process_time_ns(), now
        last_lag_kept = now
        try:
            while True:
                due = now + self.period_ns
                await asyncio.sleep(self.period_ns / 1e9)
                now = time.monotonic_ns()
                lag_ns = max(0, now - due)
                if lag_ns >= self.keep_lag_ns or now - last_lag_kept >= self.heartbeat_ns:
                    self._add(now, LOOP_LAG, lag_ns / 1e6)
                    last_lag_kept = now
                if now - self._cpu_t_ns >= self.heartbeat_ns:
                    self._cpu_sample(now)
        except asyncio.CancelledError:
            self._cpu_sample(time.monotonic_ns())
            raise

    def names(self) -> list[str]:
        """Each sample's series name."""
        return [SERIES[code] for code in self.codes]
