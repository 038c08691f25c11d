from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl

from local_target.sim import read_trace

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {}), "COLUMNS": "200"}, timeout=timeout)


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def trace_per_request(run_dir: Path) -> dict[str, dict[str, Any]]:
    """From the simulator's trace: per request id, arrival and each token's modelled emission time."""
    out: dict[str, dict[str, Any]] = {}
    for e in read_trace(run_dir / "sim_trace.jsonl"):
        if e["type"] == "request":
            out[e["id"]] = {"arrival": e["t_arrival_ns"], "tokens": {}}
        elif e["type"] == "step":
            for rid, index, t_write in e["tokens"]:
                out[rid]["tokens"][index] = (e["t_end_ns"], t_write)
    return out


def records(run_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    return pl.read_parquet(run_dir / "requests.parquet"), pl.read_parquet(run_dir / "chunks.parquet")
