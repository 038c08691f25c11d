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


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
            cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {}), "COLUMNS": "200"}, timeout=timeout)


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``loadgen ARGS`` in the background (for signals): stdout and stderr piped."""
    return subprocess.Popen([sys.executable, "-m", "loadgen", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {}), "COLUMNS": "200"})


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    """Poll ``condition()`` until true (a state to reach, not a duration to wait); AssertionError after timeout_s."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.02)


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


SIM_TRACE = ("--set", "target.simulator.trace=true")  # the embedded simulator's ground truth, sim_trace.jsonl


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


def read_until(proc: "subprocess.Popen[str]", text: str, timeout_s: float) -> str:
    """A child's stdout until a line holds ``text`` (returns what was read); AssertionError with the last lines
    if it exits or ``timeout_s`` passes first. Reads the pipe's descriptor itself: a buffered ``readline`` after
    ``select`` can take two lines at once and leave the second in its buffer, where ``select`` never sees it."""
    import selectors
    import time

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    got = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline and sel.select(max(0.0, deadline - time.monotonic())):
            data = os.read(fd, 65536)
            if not data:  # exited
                break
            got += data
            seen = got.decode(errors="replace").splitlines(keepends=True)
            if any(text in line for line in seen):
                return "".join(seen)
    seen = got.decode(errors="replace").splitlines(keepends=True)
    raise AssertionError(f"no {text!r} from {proc.args!r}:\n{''.join(seen[-40:])}")


def with_loop_blocks(run_on_loop: Any, at_s: tuple[float, ...], ms: float,
                     windows: list[tuple[int, int]]) -> Any:
    """``run/runner.event_loop_run`` with busy-waits of ``ms`` scheduled on the run's own loop ``at_s`` seconds
    after it starts (each block's real window appended to ``windows``), cancelled when the run ends: a client
    hog for targets the scenario's ``client_block_ms`` does not serve (a URL target; irregular times)."""
    import asyncio

    from loadgen.run.client_faults import ClientBlocks

    blocks = ClientBlocks(block_ms=ms, every_s=0.0, windows_ns=windows)  # its busy-wait, at these times instead

    def hogged(coro: Any) -> Any:
        async def with_blocks() -> Any:
            loop = asyncio.get_running_loop()
            handles = [loop.call_later(t, blocks.block_now) for t in at_s]
            try:
                return await coro
            finally:
                for handle in handles:
                    handle.cancel()
        return run_on_loop(with_blocks())
    return hogged
