"""What every driver's run shares, in one place: asyncio's ``run/runner.py`` and Locust's ``run/locust_run.py``
(and ``locust_ui.py``'s runs) use the same ``RunSession``, so the two cannot drift.

A session owns:
- the run directory: made (a fresh one under ``reports/``, or ``--out``), and removed again when nothing was
  sent and loadgen made it (``discard_if_empty``);
- the phase that an interrupt's or a crash's last words name (``exits.current``), with the run directory;
- the record sink and its policy: a flush every ``FLUSH_EVERY_S`` while the run sends; a flush that cannot write
  (a full disk: any ``OSError``) stops the run and makes it inconclusive (``disk_error``; exit 3), the records
  left in memory still make the summary; any other failure of a flush is a bug: a warning, the records stay
  buffered for the next flush; ``close`` flushes and merges, never raises;
- the generator's figures (what the driver's own process cost), with one key set per driver.

This module imports neither the drivers nor locust/gevent: a driver flushes on its own thread or loop (the
asyncio runner in a worker thread, Locust on its hub), with ``flush_due`` and ``flush`` deciding the rest.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape

from loadgen.run import exits
from loadgen.records.sink import RecordSink

FLUSH_EVERY_S = 1.0


class SessionOptions(Protocol):
    """Where the run directory goes (``RunOptions``)."""

    out: Path | None
    reports_dir: Path


def slug(name: str) -> str:
    """A scenario name as one safe path component (never a path: ``../../x`` becomes ``x``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:80] or "run"


def make_run_dir(scenario_name: str, opts: SessionOptions) -> Path:
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
        return opts.out
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = opts.reports_dir / f"{stamp}-{slug(scenario_name)}"
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = opts.reports_dir / f"{stamp}-{slug(scenario_name)}-{n}"
    run_dir.mkdir(parents=True)
    return run_dir


class RunSession:
    """One run's directory, phase, record sink and flush policy (see the module's docstring)."""

    def __init__(self, scenario_name: str, opts: SessionOptions, console: Console) -> None:
        self.created = opts.out is None or not opts.out.exists()  # loadgen made it: loadgen may remove it
        self.run_dir = make_run_dir(scenario_name, opts)
        self.console = console
        self.sink = RecordSink(self.run_dir)
        self.disk_error: str | None = None
        self._last_flush_s = time.monotonic()
        self.phase("preflight")

    # ---- the phase and the run directory ------------------------------------------------------------
    def phase(self, name: str) -> None:
        """Where the run is, for an interrupt's or a crash's last words (``exits.interrupted_line``)."""
        exits.current.update(run_dir=self.run_dir, phase=name)

    def discard_if_empty(self) -> None:
        """Nothing was sent: leave no empty run directory behind (only one loadgen made)."""
        if self.created and not any(self.run_dir.glob("*.parquet")):
            shutil.rmtree(self.run_dir, ignore_errors=True)
        exits.current.update(run_dir=None)

    # ---- the records ---------------------------------------------------------------------------------
    def flush_due(self) -> bool:
        """Whether the driver should flush now: records wait, a second has passed, the disk has not failed."""
        if self.disk_error or not self.sink.pending() or time.monotonic() - self._last_flush_s < FLUSH_EVERY_S:
            return False
        self._last_flush_s = time.monotonic()
        return True

    def flush(self) -> bool:
        """Write what the sink holds (on whichever thread the driver chooses); True when the run must stop
        sending because the records cannot be written (the disk is full). Never raises."""
        try:
            self.sink.flush()
        except Exception as exc:  # noqa: BLE001 - the records stay in memory either way
            return self.flush_failed(exc)
        return False

    def flush_failed(self, exc: Exception) -> bool:
        """A flush raised; True when the run must stop sending (the disk is full). Anything else is a bug: a
        warning, and the records stay buffered for the next flush."""
        if isinstance(exc, OSError):
            self.disk_error = f"{exc.strerror or exc} ({self.run_dir})"
            self.console.print(f"[red]error:[/] cannot write records: {escape(self.disk_error)}; stopping the run",
                               highlight=False)
            return True
        self.console.print(f"[yellow]warning:[/] a flush of the records failed ({type(exc).__name__}: "
                           f"{escape(str(exc))}); they are kept and written later", highlight=False)
        return False

    def close(self) -> None:
        """Flush and merge the records; a full disk (or any failure to write them) is recorded, and the run
        becomes inconclusive: never raised. The records left in memory still make the summary."""
        try:
            self.sink.close()
        except OSError as exc:
            self.disk_error = self.disk_error or f"{exc.strerror or exc} ({self.run_dir})"
        except Exception as exc:  # noqa: BLE001 - a bug writing them: said, and the summary still made
            self.disk_error = self.disk_error or f"{type(exc).__name__}: {exc} ({self.run_dir})"

    def write_failed(self, exc: OSError) -> None:
        """Writing run.json or a report hit the disk's limit: the run is inconclusive from here."""
        self.disk_error = f"{exc.strerror or exc} ({self.run_dir})"


def generator_figures(engine: str, cpu_s: float | None = None, wall_s: float | None = None,
                      **extra: Any) -> dict[str, Any]:
    """How the generator fared, one shape for every driver: its engine, the driver's own figures (``extra``:
    Locust's workers and the ones that left), and, where this process did the sending, its CPU against the
    wall clock."""
    figures: dict[str, Any] = {"engine": engine, **extra}
    if cpu_s is not None and wall_s is not None:
        figures.update(cpu_s=round(cpu_s, 3), wall_s=round(wall_s, 3),
                       cpu_utilization=round(cpu_s / wall_s, 3) if wall_s else None)
        figures.update(processes=1, max_cpu_utilization=figures["cpu_utilization"])
    return figures


def processes_figures(engine: str, processes: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Several sending processes (``--workers N``): each one's CPU against its own wall clock (``per_process``),
    their sum against the longest wall clock (``cpu_utilization``: cores' worth), and the busiest one's
    (``max_cpu_utilization``: the CPU-saturation rule's figure, docs/verdicts.md)."""
    rows = [_process_row(p) for p in processes]
    figures: dict[str, Any] = {"engine": engine, "processes": len(rows), **extra}
    cpus = [r["cpu_s"] for r in rows if r.get("cpu_s") is not None]
    walls = [r["wall_s"] for r in rows if r.get("wall_s")]
    if cpus and walls:
        figures.update(cpu_s=round(sum(cpus), 3), wall_s=round(max(walls), 3),
                       cpu_utilization=round(sum(cpus) / max(walls), 3))
    utils = [r["cpu_utilization"] for r in rows if r.get("cpu_utilization") is not None]
    figures.update(max_cpu_utilization=max(utils) if utils else None, per_process=rows)
    return figures


def _process_row(p: dict[str, Any]) -> dict[str, Any]:
    cpu_s, wall_s = p.get("cpu_s"), p.get("wall_s")
    row = {"process": p.get("process"), "pid": p.get("pid"),
           "cpu_s": None if cpu_s is None else round(cpu_s, 3), "wall_s": None if wall_s is None else round(wall_s, 3),
           "cpu_utilization": round(cpu_s / wall_s, 3) if cpu_s is not None and wall_s else None}
    if p.get("start_late_ms") is not None:
        row["start_late_ms"] = p["start_late_ms"]
    if p.get("read_stamps") is not None:
        row["read_stamps"] = p["read_stamps"]
    return row
