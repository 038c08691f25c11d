"""--engine locust (one process and master + workers), loadgen worker, and what must not import Locust."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.run_helpers import ROOT, SIM_TRACE, read_until, records, run_cli, summary, trace_per_request, wait_for

# seconds-long runs that test the engines, not the verdict's statistics: decided on point values
SHORT = ["--no-progress", "--no-png", "--set", "load.arrival=constant", "--set", "load.rate_per_s=6",
         "--set", "load.warmup_s=0", "--set", "slo.decision=point"]


def test_core_analysis_and_asyncio_engine_do_not_import_locust_or_gevent():
    code = ("import sys, loadgen.core, loadgen.analysis.summary, loadgen.drivers.asyncio_engine, loadgen.run.runner, "
            "loadgen.drivers.engine_thread; bad = [m for m in ('locust', 'gevent') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def _medians_vs_trace(out: Path) -> tuple[float, float, float, float]:
    """(client TTFT median, client ITL median, TTFT error median vs the trace, worst per-request ITL error)."""
    requests, chunks = records(out)
    trace = trace_per_request(out)
    ttfts, itls, ttft_err, itl_err = [], [], [], []
    for row in requests.iter_rows(named=True):
        truth = trace[row["request_id"]]
        emitted = [truth["tokens"][i][0] for i in sorted(truth["tokens"])]
        ttft = (row["t_first_token_ns"] - row["t_sent_ns"]) / 1e6
        ttfts.append(ttft)
        ttft_err.append(ttft - (emitted[0] - truth["arrival"]) / 1e6)
        times = chunks.filter((pl.col("seq") == row["seq"]) & (pl.col("worker") == row["worker"]))["t_ns"].to_list()
        gaps = [(b - a) / 1e6 for a, b in zip(times, times[1:])]
        itls += gaps
        itl_err.append(statistics.median(gaps) - statistics.median(
            (b - a) / 1e6 for a, b in zip(emitted, emitted[1:])))
    return (statistics.median(ttfts), statistics.median(itls), statistics.median(ttft_err),
            max(abs(e) for e in itl_err))


@pytest.mark.timing
def test_locust_with_two_workers_matches_asyncio_and_the_trace(tmp_path):
    """Requests short enough to meet an idle engine (6/s, 16 output tokens): TTFT is then the prefill alone, the
    same in both runs, rather than depending on where in a running step each request happened to land."""
    runs = {}
    alone = ["--set", "workload.classes.0.output_tokens={dist: fixed, value: 16}"]
    for engine, extra in (("asyncio", []), ("locust", ["--engine", "locust", "--workers", "2"])):
        out = tmp_path / engine
        res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "6", *SHORT, *alone, *extra,
                      *SIM_TRACE)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[engine] = out
    (a_req, _), (l_req, _) = records(runs["asyncio"]), records(runs["locust"])
    assert a_req.height == l_req.height == summary(runs["locust"])["requests"]["planned"]
    assert sorted(l_req["worker"].unique().to_list()) == [0, 1]  # both workers sent their slice
    a, lo = _medians_vs_trace(runs["asyncio"]), _medians_vs_trace(runs["locust"])
    assert abs(a[0] - lo[0]) <= 1.0 and abs(a[1] - lo[1]) <= 1.0  # TTFT and ITL medians, engine vs engine
    for medians in (a, lo):
        assert abs(medians[2]) <= 1.0 and medians[3] <= 1.0  # each engine vs the simulator's trace
    assert summary(runs["locust"])["generator"]["engine"] == "locust"
    for out in runs.values():  # the server's /metrics scraped by either driver (the master's, with workers)
        assert summary(out)["server"]["scrapes"] >= 8 and (out / "server_metrics.parquet").exists()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


@pytest.mark.slow
def test_a_worker_killed_mid_run_keeps_what_it_sent(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "loadgen", "run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "8",
           "--engine", "locust", "--workers", "2", *SHORT]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        victim = _kill_a_worker_once_records_arrive(proc.pid, out)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 1, 3), stderr
    requests, _ = records(out)
    per_worker = dict(requests.group_by("worker").len().iter_rows())
    planned = summary(out)["requests"]["planned"]
    assert set(per_worker) == {0, 1} and requests.height < planned  # the killed worker's part is cut short
    assert min(per_worker.values()) < planned // 2 <= max(per_worker.values()) + 1
    notes = " ".join(summary(out)["notes"])
    assert "left before their plan ended" in notes, (victim, notes, stdout[-2000:])
    assert "left before their plan ended" in stdout and "left before" in (out / "summary.md").read_text()


def _kill_a_worker_once_records_arrive(master_pid: int, out: Path) -> int:
    """SIGKILL one worker process as soon as the master has written records from both workers."""
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        parts = list(out.glob("requests.part-*.parquet")) if out.exists() else []
        if parts and pl.read_parquet(parts)["worker"].n_unique() == 2:
            workers = [p for p in _children(master_pid) if b"worker" in Path(f"/proc/{p}/cmdline").read_bytes()]
            if workers:
                os.kill(workers[-1], signal.SIGKILL)
                return workers[-1]
        time.sleep(0.2)  # polling the run directory, not synchronising with it
    pytest.fail("no records from both workers within 60 s")


def test_loadgen_ui_ended_by_sigterm_stops_its_simulator():
    """`kill PID` (or `timeout`) must clean up as Ctrl-C does: no simulator left running."""
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "ui", "scenarios/smoke.yaml", "--port", "8397"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        read_until(proc, "web UI", 60)
        sims = _children(proc.pid)
        assert sims, "the embedded simulator should be a child process"
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = [pid for pid in sims
            if Path(f"/proc/{pid}").exists() and b"zombie" not in Path(f"/proc/{pid}/status").read_bytes().lower()]
    for pid in left:  # ours, started by the process under test: do not leave them behind
        os.kill(pid, signal.SIGKILL)
    assert not left, "the simulator outlived loadgen ui"


def test_bad_engine_flags_exit_2():
    res = run_cli("run", "scenarios/smoke.yaml", "--engine", "nope")
    assert res.returncode == 2 and "--engine" in res.stderr
    res = run_cli("run", "scenarios/smoke.yaml", "--workers", "two")
    assert res.returncode == 2 and "--workers" in res.stderr
    res = run_cli("worker", "scenarios/smoke.yaml", "--master-port", "1")
    assert res.returncode == 2 and "--base-url" in res.stderr


def test_only_the_locust_driver_module_imports_locust_or_gevent():
    offenders = []
    for path in (ROOT / "loadgen").rglob("*.py"):
        if path.name == "locust_user.py":
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and len(words) > 1 and words[1].split(".")[0] in ("locust",
                                                                                                        "gevent"):
                offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert offenders == []


def test_the_master_gives_up_on_workers_silent_past_the_hard_end():
    """A worker that never says its slice is done must not hold the run open: past the plan's hard end and the
    grace, the master stops waiting and names the workers it did not hear from (its own process: Locust
    monkey-patches whoever imports it)."""
    code = """
import time
from rich.console import Console
import loadgen.run.locust_run as lr
from loadgen import api
sc = api.load_scenario('scenarios/smoke.yaml')
run = lr.LocustRun(sc, lr.RunOptions(), Console(quiet=True), 2, None)
run.done_workers = {'w1'}
assert not run._gave_up(None, ['w1', 'w2']) and not run._gave_up(time.monotonic() + 60, ['w1', 'w2'])
assert run.left_workers == []
assert run._gave_up(time.monotonic() - 1, ['w1', 'w2']) and run.left_workers == ['w2']
print('ok', lr.WORKER_GRACE_S)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0 and res.stdout.split() == ["ok", "15.0"], res.stderr[-2000:]


def _worker_of(master_pid: int) -> int | None:
    for pid in _children(master_pid):
        try:
            if b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def _finished(out: Path) -> bool:
    import json

    try:
        return json.loads((out / "run.json").read_text())["finished"] is True
    except (OSError, ValueError, KeyError):
        return False


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stall", "death"])
def test_a_run_ends_by_itself_within_its_bound_when_its_worker_stalls_or_dies(tmp_path, how):
    """Issue 36: a worker stopped mid-step (SIGSTOP: silent, its socket open; SIGKILL: gone) must not hold the
    run open. The run ends by itself within the bound it states (plan/deadlines.py: the hard end, the grace and
    each step of the shutdown), cut short — inconclusive, exit 3, as a run whose requests its hard end cut — with
    the records the worker had shipped before it stopped kept."""
    from loadgen import api
    from loadgen.plan.deadlines import run_bound_s
    from loadgen.plan.schedule import build_plan

    sets = {"load.arrival": "constant", "load.rate_per_s": 6, "load.warmup_s": 0, "load.duration_s": 8,
            "load.drain_timeout_s": 2}
    sc = api.load_scenario(ROOT / "scenarios/smoke.yaml", overrides=sets)
    bound_s = run_bound_s(build_plan(sc), sc)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "loadgen", "run", "scenarios/smoke.yaml", "--out", str(out), "--no-progress",
           "--no-png", "--engine", "locust", "--workers", "2",
           *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    worker = None
    try:
        wait_for(lambda: any(out.glob("requests.part-*.parquet")), 90, "the worker's first records on disk")
        worker = _worker_of(proc.pid)
        assert worker is not None, "the worker process should be a child of the run"
        kept = pl.read_parquet(list(out.glob("requests.part-*.parquet"))).height
        os.kill(worker, signal.SIGSTOP if how == "stall" else signal.SIGKILL)
        import time

        stopped_at = time.monotonic()
        wait_for(lambda: _finished(out), bound_s, f"the run's end within its bound ({bound_s:g} s)")
        ended_s = time.monotonic() - stopped_at
        stdout, stderr = proc.communicate(timeout=120)  # the reports, after the run's end
    finally:
        if worker is not None and Path(f"/proc/{worker}").exists():
            os.kill(worker, signal.SIGKILL)  # ours (started by the run under test); SIGKILL ends a stopped one too
        if proc.poll() is None:
            proc.kill()
    assert ended_s <= bound_s and proc.returncode == 3, (ended_s, bound_s, proc.returncode, stderr[-2000:])
    requests, _ = records(out)
    assert kept <= requests.height < summary(out)["requests"]["planned"]  # what it shipped is kept; no more
    notes = " ".join(summary(out)["notes"])
    assert "left before their plan ended" in notes, (notes, stdout[-2000:])
    assert summary(out)["verdict"] == "inconclusive"
