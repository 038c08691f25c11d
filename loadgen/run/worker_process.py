"""One sending process of ``loadgen run --workers N`` on the asyncio engine (run/workers.py starts N of them).

A process is a ``Run`` (run/runner.py) of its share of the plan (plan/shares.py) into a record directory of its
own under the run directory (``workers/<k>/``, flushed every second as any run's): it resolves the target,
builds its prompts, says ``ready`` on its pipe, and sends from the parent's common start (``start``: a monotonic
instant, the same clock in every process on the machine), so the shares keep the plan's instants. Messages to
the parent: ``("ready", None)``, ``("n", records so far)``, ``("stopped", reason)`` (its fail-fast guard stopped
it: the parent stops the others), ``("done", figures)``, ``("error", kind, message)``. From the parent:
``("start", t0_ns)`` and ``("stop", reason)``; a closed pipe (the parent gone) stops it too. SIGINT and SIGTERM
stop it as they stop any run: what is in flight is cancelled and recorded, the records are written.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console

from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.core.secrets import register
from loadgen.drivers import kernel_stamps
from loadgen.drivers.asyncio_engine import START_LEAD_MS, AsyncioEngine
from loadgen.errors import ServerFault, TargetError
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import build_plan
from loadgen.plan.shares import WorkerPlan, share_scenario, strided_seqs
from loadgen.plan.until_spec import horizon
from loadgen.run import exits
from loadgen.run.loops import event_loop_run
from loadgen.run.runner import Run, RunOptions
from loadgen.run.session import RunSession

PROGRESS_EVERY_S = 0.5
SPIN_S = 0.002  # the last stretch before the start is a busy wait: asyncio's timers are late by ~1 ms


@dataclass
class Share:
    """What a process needs to run its share (pickled to it: the spawn start method)."""

    scenario: Scenario
    index: int
    workers: int
    base_url: str
    out: Path
    secrets: list[str]


class ShareEngine(AsyncioEngine):
    """The asyncio engine, numbering a closed loop's requests ``index, index + N, …`` (unique across processes)."""

    _strided: Iterator[int] | None = None

    def next_seq(self) -> int:
        if self._strided is None:
            plan = self.plan
            assert isinstance(plan, WorkerPlan)
            self._strided = strided_seqs(plan.index, plan.workers)
        return next(self._strided)


class ShareRun(Run):
    engine_class = ShareEngine

    def __init__(self, share: Share, conn: Connection, console: Console) -> None:
        opts = RunOptions(out=share.out, progress=False, png=False, server_metrics=False)
        plan = WorkerPlan(build_plan(horizon(share.scenario)), share.index, share.workers)
        session = RunSession(share.scenario.name, opts, console)
        super().__init__(share_scenario(share.scenario, share.index, share.workers), plan, session, console, opts)
        self.share, self.conn = share, conn
        self.start_ns: int | None = None
        self.start_late_ms: float | None = None  # how late it took over for the start (0: in time)
        self.recorded, self._said_s = 0, 0.0

    async def before_sending(self, engine: AsyncioEngine) -> None:
        """Say ``ready``; wait for the common start (or a stop), then hand over to the engine just before it."""
        loop = asyncio.get_running_loop()
        started: asyncio.Future[int | None] = loop.create_future()

        def on_message() -> None:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                msg = ("stop", "the parent process is gone")
                loop.remove_reader(self.conn.fileno())
            if msg[0] == "start" and not started.done():
                started.set_result(int(msg[1]))
            elif msg[0] == "stop":
                self.interrupted = self.interrupted or msg[1] == "interrupted"
                engine.stop(f"run stopped: {msg[1]}")
                if not started.done():
                    started.set_result(None)
        loop.add_reader(self.conn.fileno(), on_message)
        gc.collect()  # the engine collects before its t0 (drivers/timing.py): ~0.1 s of a full heap, not
        gc.freeze()   # to be spent after the common start; what is alive now is never collected again
        self.conn.send(("ready", None))
        self.start_ns = await started
        if self.start_ns is not None:  # the engine takes the common start as its t0, and over START_LEAD_MS ahead
            engine.t0_ns = self.start_ns
            await spin_until(self.start_ns - int(START_LEAD_MS * 1e6))
            self.start_late_ms = round((time.monotonic_ns() - self.start_ns) / 1e6 + START_LEAD_MS, 3)

    def on_record(self, record: RequestRecord, chunks: list[ChunkRecord], answer: str = "") -> None:
        record.worker = self.share.index
        for c in chunks:
            c.worker = self.share.index
        super().on_record(record, chunks, answer)
        self.recorded += 1
        if time.monotonic() - self._said_s >= PROGRESS_EVERY_S:
            self._said_s = time.monotonic()
            _send(self.conn, ("n", self.recorded))

    def _stop_early(self, reason: str) -> None:
        super()._stop_early(reason)
        _send(self.conn, ("stopped", reason))

    def figures(self, notes: list[str]) -> dict[str, Any]:
        """What the parent reports of this process: its CPU over its sending, its start, its notes."""
        st = self._engine.stats if self._engine is not None else None
        return {"process": self.share.index, "pid": os.getpid(), "records": self.recorded,
                "cpu_s": st.cpu_s if st else None, "wall_s": st.wall_s if st else None,
                "read_stamps": kernel_stamps.STATS.as_dict(),
                "start_late_ms": self.start_late_ms, "prompts": self.prompt_stats, "notes": notes,
                "stopped_early": self.fail_fast.reason, "interrupted": self.interrupted,
                "disk_error": self.disk_error, "sessions_not_finished": self.sessions_not_finished}


async def spin_until(t_ns: int) -> None:
    """Until the monotonic clock reads ``t_ns``: asleep, then the last ``SPIN_S`` busy (nothing else runs yet)."""
    ahead_s = (t_ns - time.monotonic_ns()) / 1e9 - SPIN_S
    if ahead_s > 0:
        await asyncio.sleep(ahead_s)
    while time.monotonic_ns() < t_ns:
        pass


def _send(conn: Connection, msg: tuple[Any, ...]) -> None:
    try:
        conn.send(msg)
    except (OSError, ValueError):  # the parent is gone: the run ends by its own bound, the records stay
        pass


def main(share: Share, conn: Connection) -> None:
    """The process's entry point (multiprocessing, spawn): the share run, its figures or its error on ``conn``."""
    register(*share.secrets)
    run: ShareRun | None = None
    try:
        run = ShareRun(share, conn, Console(stderr=True, quiet=True))
        target = event_loop_run(run.execute(share.base_url, None))
        _send(conn, ("done", run.figures(list(target.notes))))
    except (TargetError, ServerFault) as exc:
        _send(conn, ("error", "target", str(exc)))
    except (exits.Interrupted, KeyboardInterrupt):
        _send(conn, ("error", "interrupted", "interrupted before sending"))
    except BaseException as exc:  # a bug: said to the parent, then the traceback on stderr
        _send(conn, ("error", "crash", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        if run is not None:
            run.close_sink()
