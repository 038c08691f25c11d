"""client_metrics.parquet: loadgen's own health during a run, in the shape of server_metrics.parquet (``t_ns``
Int64 on the records' monotonic clock, ``name`` String, ``value`` Float64). The series (sampled by
``drivers/loop_sampler.py`` while the asyncio driver's engine runs; the Locust driver writes none):

- ``loop_lag_ms``: a timer due every 50 ms fired this late at ``t_ns``: the loop was blocked over
  ``[t_ns − value, t_ns]``. Lags of 2 ms and more are all kept, smaller ones once a second.
- ``cpu_busy_share``: loadgen's process CPU seconds / wall seconds since the previous sample of it (about a
  second; every thread, so it may exceed 1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import polars as pl

FILE = "client_metrics.parquet"
SCHEMA = pl.Schema({"t_ns": pl.Int64, "name": pl.String, "value": pl.Float64})


def client_metrics_frame(t_ns: Sequence[int], names: Sequence[str], values: Sequence[float]) -> pl.DataFrame:
    """The rows as a frame of SCHEMA (the sampler's columns: ``array``s and a list of names)."""
    return pl.DataFrame({"t_ns": t_ns, "name": names, "value": values}, schema=SCHEMA)


def write_client_metrics(run_dir: Path, frame: pl.DataFrame) -> str | None:
    """client_metrics.parquet in ``run_dir`` (written aside, then renamed: never a half file under its name);
    None, or why it could not be written (one line; a full disk never stops the run)."""
    path = run_dir / FILE
    tmp = path.with_name(f".{FILE}.tmp")
    try:
        frame.select(list(SCHEMA)).cast(SCHEMA).write_parquet(tmp)
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - polars wraps OS errors in its own kinds
        tmp.unlink(missing_ok=True)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"client metrics ({FILE}) not written: {reason[:160]}"
    return None


def read_client_metrics(run_dir: Path) -> pl.DataFrame | None:
    """The run's client metrics; None when the run has none (the Locust driver, an older loadgen) or the file
    is damaged or not this file's shape."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return None
    try:
        frame = pl.read_parquet(path)
    except Exception:  # noqa: BLE001 - polars raises several kinds for a damaged file
        return None
    if any(frame.schema.get(name) != dtype for name, dtype in SCHEMA.items()):
        return None
    return frame.select(list(SCHEMA))
