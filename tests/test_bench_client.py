"""``loadgen bench-client``: bad flags are one line and exit 2 before anything starts; the ladder, the pinning
and the stopping rule; a short real self-test (two small steps) whose table, last line and JSON agree, its
throughput checked against the emitter's configured schedule; and a kill that stops the step's processes."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loadgen.cli.app import app
from loadgen.run import bench_client as bc
from tests.run_helpers import run_cli, start_cli, wait_for


@pytest.mark.parametrize("args, message", [
    (["--start", "16", "--max-streams", "8"], "--max-streams 8: give a number of streams from --start (16)"),
    (["--start", "0"], "--start 0: give a number of streams from 1"),
    (["--max-streams", "5000"], "--max-streams 5000: give a number of streams from --start (32) to 4096"),
    (["--max-error", "2s"], "--max-error 2s: a tolerance of a second or more tests nothing"),
    (["--max-error", "x"], "--max-error x: give a time"),
    (["--step-duration", "0"], "--step-duration 0: give a finite time above 0"),
    (["--engine", "trio"], "--engine 'trio': choose asyncio or locust"),
    (["--max-streams", "abc"], "--max-streams 'abc': give a whole number of streams"),
    (["--start", "1.5"], "--start '1.5': give a whole number of streams"),
    (["--workers", "two"], "--workers 'two': give a number of processes or auto"),
])
def test_a_bad_flag_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["bench-client", *args], env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error: ")
    assert message in res.stderr
    assert res.stdout == ""  # nothing started: no header, no step


def test_an_out_that_is_a_directory_is_refused_before_any_step(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["bench-client", "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--out" in res.stderr and "a directory" in res.stderr and res.stdout == ""


def test_the_ladder_doubles_to_128_then_climbs_by_64_to_the_maximum() -> None:
    assert bc.ladder(32, 512) == [32, 64, 128, 192, 256, 320, 384, 448, 512]
    assert bc.ladder(8, 16) == [8, 16]
    assert bc.ladder(100, 300) == [100, 200, 264, 300]
    assert bc.ladder(64, 64) == [64]


def test_the_emitter_and_loadgen_get_different_cpus_when_there_are_two() -> None:
    assert bc.plan_pinning([0]) == bc.Pinning(None, None, 1)
    assert "not pinned" in bc.plan_pinning([3]).describe()
    assert bc.plan_pinning([2, 0, 1, 3]) == bc.Pinning(0, (1,))
    assert bc.plan_pinning([0, 1, 2, 3], processes=2) == bc.Pinning(0, (1, 2), 2)
    assert bc.plan_pinning([0, 1], processes=2).describe().endswith("; its 2 processes share 1 CPU")
    assert bc.plan_pinning([0, 1, 2, 3]).describe().startswith("emitter on CPU 0, loadgen on CPU 1")


def _row(streams: int, gap_ms: float, ttft_ms: float, failed: int = 0) -> dict[str, Any]:
    return {"streams": streams, "tokens_per_s": streams * 190.0, "gap_p99_ms": gap_ms, "ttft_p99_ms": ttft_ms,
            "measured": 10, "failed": failed}


def test_stepping_stops_after_the_first_step_past_the_tolerance(monkeypatch: pytest.MonkeyPatch) -> None:
    errors = {32: (0.2, 0.3), 64: (0.5, 0.9), 128: (0.6, 1.4), 192: (0.1, 0.1)}
    ran: list[int] = []

    def step(streams: int, *_: Any) -> dict[str, Any]:
        ran.append(streams)
        return _row(streams, *errors[streams])
    monkeypatch.setattr(bc, "run_step", step)
    settings = bc.Settings([32, 64, 128, 192], 1.0, 1.0)
    rows = bc.bench(settings, bc.Pinning(None, None), lambda i, n: None, lambda r: None)
    assert ran == [32, 64, 128] and [r["held"] for r in rows] == [True, True, False]
    assert bc.final_line(rows, 1.0, 1) == "loadgen measures up to 12,160 tokens/s within 1 ms on this machine " \
                                          "(one process)"


def test_no_step_held_says_so_with_the_first_steps_errors() -> None:
    rows = [{**_row(32, 1.5, 0.4), "held": False}]
    line = bc.final_line(rows, 1.0, 1)
    assert line.startswith("loadgen measured no step within 1 ms on this machine (one process): at 32 streams")
    assert "chunk-gap p99 error 1.50 ms" in line
    assert bc.final_line([{**_row(32, float("nan"), float("nan"), failed=32), "held": False}], 1.0, 1).endswith(
        "chunk-gap p99 error not measured, TTFT p99 error not measured, 32 failed")
    assert bc.final_line([], 1.0, 1) == "loadgen measured no step on this machine (one process): none ended"


@pytest.mark.parametrize("row", [_row(32, float("nan"), 0.1), _row(32, 0.1, 0.1, failed=1),
                                 {**_row(32, 0.1, 0.1), "measured": 0}, _row(32, 0.1, 1.01)])
def test_a_step_without_evidence_or_with_a_failure_does_not_hold(row: dict[str, Any]) -> None:
    assert not bc.held(row, 1.0)


def test_the_bound_is_every_step_its_load_and_the_startup_allowance() -> None:
    assert bc.bound_s(3, 10.0) == 3 * (10.0 + 62.0)  # docs/bench-client.md: steps × (--step-duration + 62 s)


TABLE_ROW = re.compile(r"^\| (\d+) \| ([\d,]+) \| ([\d.]+) ms \| ([\d.]+) ms \| ([\d.]+) ms \| (\d+) µs \| (yes|no)"
                       r"(?: \(\d+ failed\))? \|$")


@pytest.mark.slow
def test_a_short_self_test_prints_its_table_last_line_and_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    res = run_cli("bench-client", "--start", "8", "--max-streams", "16", "--step-duration", "2s", "--out",
                  str(out), timeout=bc.bound_s(2, 2.0) + 30)
    assert res.returncode in (0, 1), res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("loadgen bench-client: 2 steps of 8, 16 streams") and "ends within" in lines[0]
    assert lines[1].startswith("machine: ") and lines[2].startswith("pinning: ")
    assert isinstance(json.loads(out.read_text())["load_average_1m_before"], float)
    assert "step 1/2: 8 streams" in res.stderr
    rows = [m.groups() for m in map(TABLE_ROW.match, lines) if m]
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    steps = doc["steps"]
    assert [int(r[0]) for r in rows] == [s["streams"] for s in steps] and steps[0]["streams"] == 8
    assert len(steps) == 2 or not steps[0]["held"]  # the second step runs only if the first held
    for row, step in zip(rows, steps):
        assert int(row[1].replace(",", "")) == round(step["tokens_per_s"])
        assert (row[6] == "yes") == step["held"] == bc.held(step, 1.0)
        # the emitter's schedule: 128 tokens, the first 20-25 ms after the request, then one every 5 ms
        truth = step["streams"] * bc.OUTPUT_TOKENS / ((bc.TTFT_MS + bc.ITL_MS / 2 + 127 * bc.ITL_MS) / 1e3)
        assert step["tokens_per_s"] == pytest.approx(truth, rel=0.25)
        assert step["measured"] > 0 and step["gap_p99_ms"] >= 0 and step["ttft_p99_ms"] >= 0
    assert lines[-1] == doc["result"]["line"]
    top = max((s for s in steps if s["held"]), key=lambda s: s["streams"], default=None)
    if top is None:
        assert res.returncode == 1 and lines[-1].startswith("loadgen measured no step within 1 ms")
    else:
        assert res.returncode == 0 and doc["result"]["streams"] == top["streams"]
        assert lines[-1] == f"loadgen measures up to {top['tokens_per_s']:,.0f} tokens/s within 1 ms on this " \
                            "machine (one process)"
    assert not math.isnan(doc["steps"][0]["emitter_lateness_p99_us"])


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _running(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace")
    except OSError:
        return False


@pytest.mark.slow
def test_kill_stops_the_step_and_its_processes_and_still_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = start_cli("bench-client", "--start", "8", "--max-streams", "8", "--step-duration", "30s", "--out",
                     str(out))
    try:
        wait_for(lambda: len(_children(proc.pid)) == 2, 30, "the emitter and loadgen run started")
        children = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3 and "interrupted" in stderr
    assert not [c for c in children if _running(c)]
    assert stdout.strip().splitlines()[-1] == json.loads(out.read_text())["result"]["line"]


_STEP_CHILD = """
import signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def term(*_):
    (out / "terminated").write_text("")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
worker = subprocess.Popen([sys.executable, "-c",
                           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
(out / "worker").write_text(str(worker.pid))
time.sleep(60)
"""


def test_a_step_past_its_time_is_sigtermed_first_and_its_processes_end(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's child (as ``loadgen run``) past its time gets SIGTERM, not SIGKILL; a process it started that is
    still there after its grace (a --workers process) is SIGKILLed with its process group."""
    monkeypatch.setattr(bc, "STOP_GRACE_S", 1.0)
    with pytest.raises(subprocess.TimeoutExpired):
        bc.run_child([sys.executable, "-c", _STEP_CHILD, str(tmp_path)], None, timeout_s=3.0)
    assert (tmp_path / "terminated").exists()
    worker = int((tmp_path / "worker").read_text())
    wait_for(lambda: not _running(worker), 5, "the step's worker ended")


@pytest.mark.slow
def test_workers_are_passed_to_the_run_and_named_in_the_last_line(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    res = run_cli("bench-client", "--workers", "2", "--start", "8", "--max-streams", "8", "--step-duration", "2s",
                  "--out", str(out), timeout=bc.bound_s(1, 2.0) + 30)
    assert res.returncode in (0, 1), res.stderr
    doc = json.loads(out.read_text())
    assert doc["settings"]["workers"] == 2 and doc["steps"][0]["processes"] == 2
    assert res.stdout.strip().splitlines()[-1].endswith("on this machine (2 processes)" if res.returncode == 0
                                                        else "")
    assert "(2 processes)" in doc["result"]["line"]
