"""The records of ``--workers N`` processes (each written under ``<run>/workers/<k>/``, run/worker_process.py)
merged into the run directory as one run: ``requests.parquet`` / ``chunks.parquet`` with the process in the
``worker`` column, and ``client_metrics.parquet`` (each process's loop lag and CPU share, one series per name).

Each process's directory is read whatever form it was left in (merged, parts, or a damaged part skipped and
named: records/scan.py), so what a crashed process flushed is kept. The merged pair is written aside and renamed
into place; only then are the processes' directories removed: a failure on the way leaves every record on disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from loadgen.records.client_metrics import FILE as CLIENT_FILE, read_client_metrics, write_client_metrics
from loadgen.records.schema import CHUNK_SCHEMA, REQUEST_SCHEMA
from loadgen.records.scan import read_all
from loadgen.records.sink import write_atomic

WORKERS_DIR = "workers"


def share_dir(run_dir: Path, index: int) -> Path:
    return run_dir / WORKERS_DIR / str(index)


def merge_shares(run_dir: Path, processes: int) -> list[str]:
    """Merge the processes' records into ``run_dir``; returns what could not be read (one line each). A seq
    sent by two processes (a bug) is said, never dropped."""
    broken: list[str] = []
    if not (run_dir / WORKERS_DIR).is_dir():  # nothing was started (or the empty run was removed)
        return broken
    requests, chunks, client = [], [], []
    for k in range(processes):
        d = share_dir(run_dir, k)
        if not d.exists():
            continue
        req, chk = read_all(d, broken, merge=False)
        requests.append(req.with_columns(pl.lit(k, pl.Int64).alias("worker")))
        chunks.append(chk.with_columns(pl.lit(k, pl.Int64).alias("worker")))
        metrics = read_client_metrics(d)
        if metrics is not None:
            client.append(metrics)
    req_all = pl.concat(requests, how="diagonal_relaxed") if requests else pl.DataFrame(schema=REQUEST_SCHEMA)
    chk_all = pl.concat(chunks, how="diagonal_relaxed") if chunks else pl.DataFrame(schema=CHUNK_SCHEMA)
    twice = req_all.height - req_all["seq"].n_unique()
    if twice:
        broken.append(f"{twice} request number(s) (seq) were sent by more than one process (a bug; please report)")
    _write_pair(run_dir, req_all.sort("t_intended_ns"), chk_all)
    if client:
        why = write_client_metrics(run_dir, pl.concat(client).sort("t_ns"))
        if why is not None:
            broken.append(why)
    shutil.rmtree(run_dir / WORKERS_DIR, ignore_errors=True)
    return broken


def _write_pair(run_dir: Path, requests: pl.DataFrame, chunks: pl.DataFrame) -> None:
    """requests.parquet and chunks.parquet, each written aside and renamed into place."""
    write_atomic({run_dir / "requests.parquet": requests.select(list(REQUEST_SCHEMA)).cast(REQUEST_SCHEMA),
                  run_dir / "chunks.parquet": chunks.select(list(CHUNK_SCHEMA)).cast(CHUNK_SCHEMA)})


__all__ = ["CLIENT_FILE", "WORKERS_DIR", "merge_shares", "share_dir"]
