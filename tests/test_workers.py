"""--workers N|auto: one plan split between N sending processes (plan/shares.py, pure), their records merged into
one run directory with one verdict (run/workers.py), the CPU-saturation rule (analysis/generator_load.py), and
Locust's closed loop with a request count under --workers."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from loadgen import api
from loadgen.analysis.generator_load import saturated_processes
from loadgen.errors import ScenarioError
from loadgen.plan.schedule import build_plan
from loadgen.plan.shares import (WorkerPlan, process_count, processes_for, share_of, share_scenario,
                                 split_count, strided_seqs)
from loadgen.run.session import processes_figures
from tests.run_helpers import ROOT, SIM_TRACE, records, run_cli, summary, trace_per_request, wait_for

SMOKE = ROOT / "scenarios" / "smoke.yaml"
QUIET = ["--no-progress", "--no-png", "--set", "load.warmup_s=0", "--set", "slo.decision=point"]


def _scenario(**sets: object) -> api.Scenario:
    return api.load_scenario(SMOKE, {"load.warmup_s": 0, **sets})


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_open_loop_shares_are_the_plan_once_at_its_instants(workers):
    plan = build_plan(_scenario(**{"load.rate_per_s": 20, "load.duration_s": 5}))
    assert plan.requests is not None
    shares = [WorkerPlan(plan, k, workers) for k in range(workers)]
    sent = sorted((r.seq, r.t_intended_offset_ns) for s in shares for r in s.requests or [])
    assert sent == [(r.seq, r.t_intended_offset_ns) for r in plan.requests]  # each once, at its planned instant
    assert sum(s.size or 0 for s in shares) == plan.size
    assert {s.hard_end_s(30.0) for s in shares} == {plan.hard_end_s(30.0)}  # one hard end for every process
    assert all(s.request(r.seq) == r for s in shares for r in s.requests or [])


def test_a_conversation_stays_whole_in_one_process():
    sc = api.load_scenario("multi_turn", {"load.duration_s": 10})
    plan = build_plan(sc)
    assert plan.requests is not None and plan.conversational
    owners: dict[int, set[int]] = {}
    for k in range(2):
        for r in share_of(plan.requests, k, 2):
            owners.setdefault(r.conversation if r.conversation is not None else -r.seq - 1, set()).add(k)
    assert all(len(o) == 1 for o in owners.values()) and {k for o in owners.values() for k in o} == {0, 1}


@pytest.mark.parametrize("size,workers", [(10, 2), (7, 3), (1, 2), (100, 16)])
def test_a_closed_loop_count_is_honoured_in_total(size, workers):
    plan = build_plan(_scenario(**{"load.arrival": "concurrency", "load.concurrency": 4, "load.requests": size,
                                   "load.duration_s": None}))
    seqs = []
    for k in range(workers):
        share = WorkerPlan(plan, k, workers)
        assert share.size == size  # the engine's seqs are strided, checked against the whole count
        mine = [s for s in (next(it) for it in [strided_seqs(k, workers)] * (size + 1)) if s < share.size]
        assert len(mine) == len(range(k, size, workers)) == split_count(size, k, workers)  # seqs k, k+N, …
        assert [share.request(s).seq for s in mine] == mine
        seqs += mine
    assert sorted(seqs) == list(range(size))


def test_closed_loop_users_in_flight_and_rate_are_split():
    sc = _scenario(**{"load.arrival": "concurrency", "load.concurrency": 5, "load.max_in_flight": 7,
                      "load.max_rate_per_s": 10, "load.requests": 20, "load.duration_s": None})
    shares = [share_scenario(sc, k, 2).load for k in range(2)]
    assert [s.concurrency for s in shares] == [3, 2] and [s.max_in_flight for s in shares] == [4, 3]
    assert [s.max_rate_per_s for s in shares] == [5, 5]
    assert sum(split_count(5, k, 3) for k in range(3)) == 5
    assert processes_for(sc, 8) == 5  # never more processes than users: one without a user sends nothing
    assert processes_for(_scenario(), 8) == 8  # an open loop: as asked
    arrivals = [WorkerPlan(build_plan(sc), k, 2).unit(1)[0].seq for k in range(2)]
    assert arrivals == [2, 3]  # a closed loop's next arrivals, strided as its seqs


def test_workers_flag_values():
    assert process_count("auto") >= 1 and process_count(3) == 3 and process_count("2") == 2
    assert process_count(0) == 1  # the old Locust meaning of 0: one process
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ScenarioError):
            process_count(bad)


def test_workers_0_is_one_process_with_a_notice_and_capture_needs_one():
    res = run_cli("run", str(SMOKE), "--workers", "0", "--server-metrics-period", "0.01")  # exit 2 before sending
    assert res.returncode == 2 and "--workers 0 is deprecated" in res.stderr and "--server-metrics-period" in res.stderr
    res = run_cli("run", str(SMOKE), "--workers", "2", "--capture", "3")
    assert res.returncode == 2 and "--capture" in res.stderr


def test_cpu_saturation_names_the_process():
    gen = processes_figures("asyncio", [{"process": 0, "pid": 11, "cpu_s": 0.5, "wall_s": 10.0},
                                        {"process": 1, "pid": 12, "cpu_s": 9.7, "wall_s": 10.0}])
    assert gen["max_cpu_utilization"] == 0.97 and gen["cpu_s"] == 10.2 and gen["processes"] == 2
    reasons = saturated_processes(gen, 0.95)
    assert len(reasons) == 1 and "sending process 1 (pid 12)" in reasons[0]
    assert saturated_processes(gen, 0.98) == []
    assert saturated_processes({"engine": "asyncio", "cpu_utilization": 0.99}, 0.95)  # one process: its figure


def _check_one_run(out, planned):
    requests, chunks = records(out)
    s = summary(out)
    assert sorted(requests["worker"].unique().to_list()) == [0, 1]  # records from both processes, one directory
    assert requests["seq"].n_unique() == requests.height == planned == s["requests"]["planned"]
    assert set(chunks["worker"].unique().to_list()) == {0, 1}
    assert not (out / "workers").exists()  # the processes' own directories merged away
    gen = s["generator"]
    assert gen["processes"] == 2 and [p["process"] for p in gen["per_process"]] == [0, 1]
    assert all(p["cpu_s"] is not None and p["cpu_utilization"] is not None for p in gen["per_process"])
    assert gen["max_cpu_utilization"] == max(p["cpu_utilization"] for p in gen["per_process"])
    assert gen["master_cpu_s"] >= 0  # the coordinating process's own, beside the senders'
    assert s["verdict"] in ("pass", "fail", "inconclusive")  # one verdict, from the merged records
    prompts = json.loads((out / "run.json").read_text())["prompts"]  # the processes' prompt figures, summed
    assert prompts["built"] >= planned and prompts["counted"] + prompts["estimated"] == prompts["built"]
    return requests


@pytest.mark.slow
def test_two_processes_closed_loop_with_a_count(tmp_path):
    out = tmp_path / "closed"
    res = run_cli("run", str(SMOKE), "--out", str(out), "--workers", "2", *QUIET, "--set", "load.arrival=concurrency",
                  "--set", "load.concurrency=3", "--set", "load.requests=13", "--set", "load.duration_s=null")
    assert res.returncode in (0, 1, 3), res.stderr
    requests = _check_one_run(out, 13)
    assert sorted(requests["seq"].to_list()) == list(range(13))  # the count, in total, each seq once
    assert dict(requests.group_by("worker").len().iter_rows()) == {0: 7, 1: 6}


@pytest.mark.slow
def test_two_processes_open_loop_keep_the_plans_instants(tmp_path):
    out = tmp_path / "open"
    res = run_cli("run", str(SMOKE), "--out", str(out), "--workers", "2", "--duration", "4", *QUIET,
                  "--set", "load.arrival=constant", "--set", "load.rate_per_s=6")
    assert res.returncode in (0, 1, 3), res.stderr
    plan = build_plan(_scenario(**{"load.arrival": "constant", "load.rate_per_s": 6, "load.duration_s": 4}))
    assert plan.requests is not None
    requests = _check_one_run(out, len(plan.requests)).sort("seq")
    t0 = requests["t_intended_ns"][0]
    skew_ms = max(abs(t - t0 - r.t_intended_offset_ns) for t, r in zip(requests["t_intended_ns"], plan.requests)) / 1e6
    assert skew_ms == 0  # one schedule from two processes: one common t0, each request at its planned instant
    per = dict(requests.group_by("worker").len().iter_rows())
    assert per == {k: len(share_of(plan.requests, k, 2)) for k in (0, 1)}


def _ttft_errors_ms(out):
    requests, _ = records(out)
    trace = trace_per_request(out)
    errors = []
    for row in requests.filter(pl.col("error_kind").is_null()).iter_rows(named=True):
        truth = trace[row["request_id"]]
        first = truth["tokens"][min(truth["tokens"])][0]
        errors.append((row["t_first_token_ns"] - row["t_sent_ns"]) / 1e6 - (first - truth["arrival"]) / 1e6)
    return errors


@pytest.mark.timing
def test_two_processes_measure_as_one_does(tmp_path):
    """Done-when of issue 41: --workers 2 gives the same errors against the simulator's truth as --workers 1, at
    half the load per process (the same plan: 6 requests/s of 16 output tokens, an idle server each time)."""
    medians = {}
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        res = run_cli("run", str(SMOKE), "--out", str(out), "--workers", workers, "--duration", "6", *QUIET,
                      "--set", "load.arrival=constant", "--set", "load.rate_per_s=6", *SIM_TRACE,
                      "--set", "workload.classes.0.output_tokens={dist: fixed, value: 16}")
        assert res.returncode == 0, res.stdout + res.stderr
        medians[workers] = statistics.median(_ttft_errors_ms(out))
    assert abs(medians["1"]) <= 1.0 and abs(medians["2"]) <= 1.0, medians
    assert abs(medians["1"] - medians["2"]) <= 1.0, medians


@pytest.mark.slow
def test_locust_closed_loop_count_with_more_workers_than_users(tmp_path):
    """Two users, three workers asked: Locust gave the users to two workers and the third never sent its share of
    load.requests nor said it was done (the run waited for its give-up point, ceil(requests / users) request
    timeouts away). Now: one worker per user at most, each reporting its CPU."""
    out = tmp_path / "locust"
    res = run_cli("run", str(SMOKE), "--out", str(out), "--engine", "locust", "--workers", "3", *QUIET,
                  "--set", "load.arrival=concurrency", "--set", "load.concurrency=2", "--set", "load.requests=7",
                  "--set", "load.duration_s=null", timeout=150)
    assert res.returncode in (0, 1, 3), res.stderr
    requests, _ = records(out)
    assert sorted(requests["seq"].to_list()) == list(range(7)) and set(requests["worker"].to_list()) == {0, 1}
    gen = summary(out)["generator"]
    assert gen["engine"] == "locust" and gen["workers"] == 2 and gen["left"] == []
    assert [p["process"] for p in gen["per_process"]] == [0, 1]
    assert all(p["cpu_s"] > 0 and p["cpu_utilization"] is not None for p in gen["per_process"])


def _spawned_children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


@pytest.mark.slow
def test_a_sending_process_killed_mid_run_is_named_and_its_records_kept(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "loadgen", "run", str(SMOKE), "--out", str(out), "--workers", "2", "--duration",
           "8", *QUIET, "--set", "load.arrival=constant", "--set", "load.rate_per_s=6"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    try:
        wait_for(lambda: len(list(out.glob("workers/1/requests.part-*.parquet"))) >= 2, 90,
                 "process 1's records on disk")
        victim = max(_spawned_children(proc.pid))  # started second: process 1
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr[-2000:]  # cut short: inconclusive at best
    requests, _ = records(out)
    per = dict(requests.group_by("worker").len().iter_rows())
    planned = summary(out)["requests"]["planned"]
    assert per[1] >= 2 and per[0] == (planned + 1) // 2 and per[1] < planned // 2  # flushed records kept
    notes = " ".join(summary(out)["notes"])
    assert f"sending process 1 (pid {victim}) ended before its share" in notes
    assert summary(out)["verdict"] == "inconclusive"


def _parent(tmp_path, gone=None):
    from types import SimpleNamespace

    from loadgen.run.workers import Parent
    run = SimpleNamespace(interrupted=False, run_dir=tmp_path, session=SimpleNamespace(disk_error=None))
    parent = Parent(_scenario(), run, 1)  # type: ignore[arg-type]
    parent.gone.update(gone or {})
    return parent


@pytest.mark.parametrize("why,raised,code", [("crash: ValueError: x", "WorkerCrash", 4),
                                             ("interrupted: interrupted before sending", "Interrupted", 3),
                                             ("target: connection refused", "TargetError", 2)])
def test_a_process_gone_before_the_start_ends_the_run_with_its_own_exit_code(tmp_path, monkeypatch, capsys, why,
                                                                            raised, code):
    import asyncio

    from loadgen.run import exits
    with pytest.raises(BaseException) as info:
        asyncio.run(_parent(tmp_path, {0: why})._until_ready())
    assert type(info.value).__name__ == raised
    if isinstance(info.value, api.TargetError):
        return  # cli/run.py: one line, exit 2 (a bad target)

    def app(standalone_mode):
        raise info.value
    monkeypatch.setitem(exits.current, "run_dir", str(tmp_path))
    assert exits.run_app(app) == code  # as the cli ends: an interrupt inconclusive (3), a crash a bug (4)
    assert (tmp_path / "crash.txt").exists() == (code == 4)


def test_the_wait_for_ready_is_bounded(tmp_path, monkeypatch):
    import asyncio

    from loadgen.run import workers
    assert workers.ready_bound_s(_scenario()) == 150.0  # docs/commands.md: 3 × preflight timeout (30 s) + 60 s
    monkeypatch.setattr(workers, "ready_bound_s", lambda scenario: 0.0)
    with pytest.raises(api.TargetError, match="process\\(es\\) 0 not ready within 0 s"):
        asyncio.run(_parent(tmp_path)._until_ready())


def test_a_full_disk_in_the_merge_is_inconclusive_and_keeps_the_records(tmp_path, monkeypatch):
    import errno

    from loadgen.records import merge

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(merge, "_write_pair", full)
    (tmp_path / "workers" / "0").mkdir(parents=True)
    parent = _parent(tmp_path)
    parent.procs = [object()]  # type: ignore[list-item]
    parent.merge()  # no exception: the run goes on to its reports
    assert "No space left on device" in parent.run.session.disk_error and "workers" in parent.run.session.disk_error
    assert (tmp_path / "workers" / "0").is_dir()


def test_the_processes_prompt_figures_are_summed():
    from loadgen.run.workers import sum_prompts
    a = {"built": 10, "counted": 4, "estimated": 6, "checked": 3, "missed": 0, "max_error_tokens": 0,
         "policy": "sampled", "verify_one_in": 10}
    b = {**a, "built": 9, "missed": 1, "max_error_tokens": 2, "policy": "every prompt"}
    total = sum_prompts([a, None, b])
    assert total is not None and total["built"] == 19 and total["counted"] == 8 and total["missed"] == 1
    assert total["max_error_tokens"] == 2 and total["policy"] == "every prompt" and total["verify_one_in"] == 10
    assert sum_prompts([None]) is None
