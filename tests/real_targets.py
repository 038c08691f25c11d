"""What the end-to-end tests against real servers (vLLM's and llama.cpp's CPU builds) share: a bundled target
started the way a user starts it (`loadgen target …`, stopped with Ctrl-C), a scenario run against it, and the
victims' worst gap."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import polars as pl

from local_target.server_process import port_free
from loadgen.analysis.calibrate import with_bursts
from loadgen.analysis.metrics import chunk_gaps
from tests.run_helpers import ROOT, read_until, records, run_cli


@contextlib.contextmanager
def serving(target_args: list[str], ready: str, port: int, startup_s: float, stop_s: float = 90) -> Iterator[None]:
    """`loadgen target ARGS` until it prints ``ready``; Ctrl-C (SIGINT) at the end, as a user would."""
    assert port_free("127.0.0.1", port), f"port {port} is taken before the test"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "target", *target_args, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        read_until(proc, ready, startup_s)
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(stop_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0 and port_free("127.0.0.1", port), "the server did not stop on Ctrl-C"


def run_scenario(scenario: str, base_url: str, out: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    res = run_cli("run", scenario, "--base-url", base_url, "--out", str(out), "--no-progress", "--no-png",
                  timeout=300)
    assert res.returncode in (0, 1, 3), res.stderr + res.stdout
    requests, chunks = records(out)
    return requests, chunks, pl.read_parquet(out / "stalls.parquet")


def worst_victim_gap_ms(requests: pl.DataFrame, chunks: pl.DataFrame, engine_steps_only: bool = False) -> float:
    """The worst gap between two chunks of a measured victim's stream. ``engine_steps_only``: the gap before a
    held delivery (the engine's tokens handed over at once after a starved API server: ``with_bursts``) left out,
    as the replay models the engine's steps, not that."""
    gaps = chunk_gaps(requests, with_bursts(chunks)).filter(~pl.col("warmup") & (pl.col("class_name") == "victim"))
    if engine_steps_only:
        gaps = gaps.filter(~pl.col("burst_start"))
    return float(gaps["chunk_gap_ms"].max())  # type: ignore[arg-type]


def assert_check_is_clean(base_url: str) -> dict:
    """``loadgen check`` against a real engine: every line ok or info, exit 0 (a real engine streams token by
    token, caches no answers, reports usage its tokenizer agrees with); its JSON, for further assertions."""
    res = run_cli("check", "--base-url", base_url, "--json", timeout=600)
    doc = json.loads(res.stdout)
    lines = {f["name"]: (f["status"], f["summary"]) for f in doc.get("findings", [])}
    print(json.dumps(lines, indent=1))
    assert res.returncode == 0 and doc["verdict"] == "clean", (res.stderr, lines)
    return doc
