"""``loadgen sweep`` / ``api.sweep``: the search finds a capacity known from the simulator's configuration, fixed
steps and --require give the documented exit codes, each step is a full run, bad input exits 2, and the
confidence calls and the search's choices hold on their own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from loadgen import api
from loadgen.analysis.capacity import judge, samples_factor, step_call
from loadgen.analysis.sweep_result import Capacity, SweepResult, exit_code
from loadgen.run.comparison import load_run
from loadgen.run.search import CapacitySearch, Probe, interval
from tests.run_helpers import run_cli

# A simulator whose every step takes 20 ms whatever the batch, 4 sequences at most, 16-token prompts and
# 10-token answers: a request holds a seat for 10 steps (200 ms), so the server completes at most
# 4 / 0.2 s = 20 requests/s (the objective is a p90 and no error at all: a 10-s step's ~120-240 requests decide
# them, where a p99 needs 367 and had each step run again longer). Constant arrivals below that meet TTFT p90
# <= 150 ms (one or two steps); above it the queue grows for the whole step and TTFT with it. The capacity under the SLOs is 20 req/s.
STEP_MS, SEATS, OUTPUT_TOKENS = 20.0, 4, 10
KNOWN_CAPACITY_PER_S = SEATS / (OUTPUT_TOKENS * STEP_MS / 1000)
KNOWN = {
    "name": "known-capacity",
    "target": {"base_url": "embedded", "simulator": {
        "preset": "a100-llama-7b", "overhead_ms": 0, "compute_ms_per_token": 0, "attention_ms_per_token2": 0,
        "weights_read_ms": STEP_MS, "kv_read_ms_per_token": 0, "max_num_seqs": SEATS}},
    "seed": 1,
    "load": {"arrival": "constant", "rate_per_s": 12, "duration_s": 10, "warmup_s": 1, "drain_timeout_s": 10},
    "workload": {"classes": [{"name": "fixed", "prompt_tokens": {"dist": "fixed", "value": 16},
                              "output_tokens": {"dist": "fixed", "value": OUTPUT_TOKENS}}]},
    "slo": {"ttft_ms": {"p90": 150}, "error_rate": {"max": 0},
            "attainment": {"ttft_ms": 150, "min_ratio": 0.9}},
}


@pytest.fixture(scope="module")
def known_scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sweep") / "known.yaml"
    path.write_text(yaml.safe_dump(KNOWN))
    return path


@pytest.fixture(scope="module")
def searched(known_scenario: Path, tmp_path_factory: pytest.TempPathFactory) -> SweepResult:
    out = tmp_path_factory.mktemp("sweep") / "search"
    return api.sweep(known_scenario, find_max="rate", tolerance=0.10, out=out, budget_s=600)


@pytest.mark.timing
def test_search_brackets_the_capacity_known_from_the_simulator(searched: SweepResult) -> None:
    cap = searched.capacity
    print(f"capacity {cap.low}–{cap.high} req/s (known {KNOWN_CAPACITY_PER_S:g}); "
          f"{len(searched.steps)} steps: {[(s.load, s.call, s.saturated) for s in searched.steps]}")
    assert cap.decided and searched.exit_code == 0
    assert cap.low <= 1.05 * KNOWN_CAPACITY_PER_S  # nothing well above the server's limit can pass
    assert cap.high >= 0.8 * KNOWN_CAPACITY_PER_S  # nothing well below it may fail
    assert (cap.high - cap.low) <= 0.10 * cap.high + 1e-9  # narrowed to the tolerance
    # saturation is called only on steps with >= 300 sends in the backlog's window (run/sweep.py): short steps
    # above the capacity fail on TTFT instead; where it is called, it lies above the capacity
    assert searched.saturation is None or searched.saturation > KNOWN_CAPACITY_PER_S
    assert searched.knee is None or searched.knee < max(s.load for s in searched.steps)
    # DistServe's attainment capacity is judged from the same steps
    assert searched.attainment_capacity is not None and searched.attainment_capacity.decided


@pytest.mark.slow
def test_every_step_is_a_full_run_and_the_sweep_files_agree(searched: SweepResult) -> None:
    out = searched.out_dir
    assert out is not None
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["schema_version"] == 1 and SweepResult.from_dict(doc, out) == searched
    for step in searched.steps:
        summary = json.loads((out / step.run_dir / "summary.json").read_text())
        assert summary["verdict"] == step.verdict and (out / step.run_dir / "report.html").exists()
        assert {o["objective"] for o in step.objectives} >= {"ttft_ms.p90", "error_rate.max", "goodput.min_ratio"}
    assert "capacity" in (out / "summary.md").read_text()
    xmlschema = pytest.importorskip("xmlschema")
    xmlschema.XMLSchema(str(Path(__file__).parent / "data" / "junit-10.xsd")).validate(str(out / "junit.xml"))


@pytest.mark.browser
@pytest.mark.slow
def test_sweep_html_renders_every_chart_in_chromium(searched: SweepResult, tmp_path: Path) -> None:
    from tests import chart_geometry as cg
    from tests.test_report_browser import open_report

    assert searched.out_dir is not None
    seen = open_report(searched.out_dir / "sweep.html", tmp_path / "sweep.png")
    print(f"screenshot: {tmp_path / 'sweep.png'}")
    assert not seen["errors"] and not seen["blocked"], seen
    curves = [f"curve_{i}" for i in range(len(searched.curves))]  # each objective's curve over the load
    assert curves and [c[0] for c in seen["charts"]] == ["throughput", "latency_ttft_ms", "latency_itl_ms",
                                                         "latency_tpot_ms", "stalls", *curves, "pareto"]
    assert all(rendered == "yes" and svgs >= 1 for _, rendered, svgs in seen["charts"]), seen["charts"]
    assert cg.problems(seen["geometry"]) == []  # a real sweep's axes: no labels run together, no empty plot
    assert seen["verdict"].startswith("capacity ")


@pytest.mark.slow
def test_fixed_rates_with_the_requirement_inside_the_interval_exit_3(known_scenario: Path, tmp_path: Path) -> None:
    res = run_cli("sweep", str(known_scenario), "--rate", "10,30", "--require", "25", "--out", str(tmp_path / "s"),
                  "--step-duration", "4", "--no-png")
    assert res.returncode == 3, res.stdout + res.stderr  # 10 passes (or is undecided), 30 fails: 25 is inside
    doc = json.loads((tmp_path / "s" / "sweep.json").read_text())
    calls = {s["load"]: s["call"] for s in doc["steps"]}
    assert calls[30.0] == "fail" and doc["capacity"]["high"] == 30.0
    assert [s["load"] for s in doc["steps"]][-1] == 30.0  # fixed steps run in the order given


@pytest.mark.parametrize("args, message", [
    ([], "exactly one of --rate"),
    (["--rate", "1,2", "--find-max", "rate"], "exactly one of --rate"),
    (["--rate", "1,x"], "--rate '1,x'"),
    (["--rate", "0,2"], "above 0"),
    (["--concurrency", "4,8"], "needs a closed-loop scenario"),
    (["--concurrency", "2.5"], "whole numbers"),
    (["--find-max", "users"], "choose rate or concurrency"),
    (["--find-max", "rate", "--tolerance", "0%"], "--tolerance"),
    (["--find-max", "rate", "--require", "-1"], "--require"),
    (["--find-max", "rate", "--set", "load.max_rate_per_s=5"], "max_rate_per_s caps closed-loop load"),
    (["--rate", "1", "--until", "forever"], "--until 'forever'"),
    (["--rate", "1", "--max-step-duration", "0"], "--max-step-duration 0"),
    (["--rate", "1", "--until", "decided", "--max-step-duration", "5"], "at least the step duration"),
    (["--find-max", "rate", "--min-step-duration", "30", "--max-step-duration", "20"],
     "--min-step-duration 30"),
])
def test_bad_sweep_input_is_one_line_and_exit_2(known_scenario: Path, tmp_path: Path, args: list[str],
                                                message: str) -> None:
    res = run_cli("sweep", str(known_scenario), *args, "--out", str(tmp_path / "never"))
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "never" / "steps").exists()


# ---- the pure parts ----------------------------------------------------------------------------------------
def _probe_until_done(search: CapacitySearch, capacity: float, noise: float = 0.0) -> list[Probe]:
    probes: list[Probe] = []
    while len(probes) < 40:
        load, _ = search.next_load(probes)
        if load is None:
            return probes
        call = "undecided" if abs(load - capacity) <= noise else "pass" if load <= capacity else "fail"
        probes.append(Probe(load, call))  # type: ignore[arg-type]
    raise AssertionError(f"the search did not stop: {probes}")


@pytest.mark.parametrize("start, capacity", [(6.0, 19.3), (64.0, 3.1), (10.0, 10.4), (1.0, 700.0)])
def test_search_brackets_then_bisects_to_the_tolerance(start: float, capacity: float) -> None:
    probes = _probe_until_done(CapacitySearch(start, start / 1024, start * 1024, tolerance=0.05), capacity)
    span = interval(probes)
    assert span.low <= capacity < span.high and span.high - span.low <= 0.05 * span.high
    assert len(probes) <= 16, probes


def test_undecided_loads_stay_inside_the_interval_and_the_search_ends() -> None:
    probes = _probe_until_done(CapacitySearch(6.0, 0.1, 1000.0, tolerance=0.02), 20.0, noise=1.5)
    span = interval(probes)
    assert span.low <= 20.0 <= span.high
    assert any(p.call == "undecided" and span.low < p.load < span.high for p in probes)


def test_concurrency_search_probes_whole_users() -> None:
    probes = _probe_until_done(CapacitySearch(4.0, 1.0, 4096.0, tolerance=0.05, integer=True), 37.5)
    assert all(p.load == int(p.load) for p in probes)
    assert interval(probes) == interval([Probe(37.0, "pass"), Probe(38.0, "fail")])


def test_saturation_counts_as_failure() -> None:
    assert interval([Probe(10, "pass"), Probe(20, "pass", saturated=True)]).high == 20


@pytest.mark.parametrize("cap, require, code", [
    (Capacity(20, 22, True), None, 0), (Capacity(20, 22, True), 15, 0), (Capacity(20, 22, True), 21, 3),
    (Capacity(20, 22, True), 30, 1), (Capacity(None, 5, False), None, 1), (Capacity(40, None, False), None, 3),
    (Capacity(40, None, False), 30, 0), (Capacity(None, None, False), None, 3)])
def test_exit_codes(cap: Capacity, require: float | None, code: int) -> None:
    assert exit_code(cap, require)[0] == code


@pytest.mark.parametrize("calls, require, code", [
    (["pass", "pass"], None, 0), (["pass", "fail"], None, 1), (["pass", "undecided"], None, 3),
    (["pass", "fail"], 5, 0)])
def test_fixed_steps_without_a_requirement_are_slo_tests(calls: list, require: float | None, code: int) -> None:
    assert exit_code(Capacity(10, 20 if "fail" in calls else None, "fail" in calls), require, calls)[0] == code


def test_confidence_calls_from_a_real_runs_records() -> None:
    golden = Path(__file__).parent / "data" / "golden_run"
    _, samples = load_run(golden)
    ttft = np.where(samples.ok, samples.ttft_ms, np.nan)
    p50 = float(np.nanmedian(ttft))  # 30 requests, victims and aggressors: a wide interval
    slo = [{"objective": "ttft_ms.p50", "threshold": t, "value": p50, "samples": samples.n, "passed": p50 <= t,
            "comparison": "<=", "note": ""} for t in (np.nanmax(ttft) * 2, np.nanmin(ttft) / 2, p50 * 1.001)]
    calls = judge(slo, samples, None)  # type: ignore[arg-type]
    assert [c.call for c in calls] == ["pass", "fail", "undecided"]
    assert all(c.ci_low <= p50 <= c.ci_high for c in calls)
    assert step_call(calls) == "fail" and step_call(calls[::2]) == "undecided" and step_call(calls[:1]) == "pass"
    few = [{"objective": "ttft_ms.p99", "threshold": 1.0, "value": None, "samples": 40, "passed": None,
            "comparison": "<=", "note": "needs >= 100 samples"}]
    assert judge(few, samples, None)[0].call == "undecided" and samples_factor(few) == 2.5  # type: ignore[arg-type]


# ---- the closed-loop rate ceiling and the Locust driver -----------------------------------------------------
def _ceiling_scenario(tmp_path: Path) -> Path:
    doc = {**KNOWN, "name": "ceiling", "load": {"arrival": "concurrency", "concurrency": 8, "max_rate_per_s": 10,
                                                "duration_s": 4, "warmup_s": 0, "drain_timeout_s": 10}}
    path = tmp_path / "ceiling.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _assert_capped(run_dir: Path, rate_per_s: float, duration_s: float) -> None:
    import polars as pl

    sent = pl.read_parquet(run_dir / "requests.parquet").sort("t_intended_ns")["t_intended_ns"]
    spacing_s = sent.diff().drop_nulls() / 1e9
    print(f"{sent.len()} sends, spacing min {spacing_s.min():.4f} s, median {spacing_s.median():.4f} s")
    # 8 users could send ~40 requests/s here (200 ms each); the ceiling spaces them 1/rate apart
    assert spacing_s.min() >= 0.98 / rate_per_s  # type: ignore[operator]
    t_s = (sent.to_numpy() - sent.min()) / 1e9
    in_any_second = max(int(np.searchsorted(t_s, t + 1.0, side="left")) - i for i, t in enumerate(t_s))
    assert in_any_second <= rate_per_s  # never more than R sends in any one second
    assert sent.len() >= 0.85 * rate_per_s * duration_s and (sent.len() - 1) / t_s[-1] >= 0.9 * rate_per_s


@pytest.mark.slow
def test_closed_loop_rate_ceiling_spaces_the_sends(tmp_path: Path) -> None:
    result = api.run(_ceiling_scenario(tmp_path), out=tmp_path / "run")
    assert result.requests["failed"] == 0
    _assert_capped(tmp_path / "run", 10, 4)


@pytest.mark.slow
def test_rate_ceiling_under_locust_and_a_sweep_through_locust_workers(tmp_path: Path,
                                                                      known_scenario: Path) -> None:
    res = run_cli("run", str(_ceiling_scenario(tmp_path)), "--engine", "locust", "--out", str(tmp_path / "run"),
                  "--no-progress", "--no-png")
    assert res.returncode in (0, 3), res.stdout + res.stderr
    _assert_capped(tmp_path / "run", 10, 4)
    res = run_cli("sweep", str(known_scenario), "--rate", "8,16", "--engine", "locust", "--workers", "2",
                  "--step-duration", "5", "--no-png", "--out", str(tmp_path / "sweep"))
    doc = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [s["load"] for s in doc["steps"] if s["attempt"] == 1] == [8.0, 16.0], res.stdout + res.stderr
    for step in doc["steps"]:
        run = json.loads((tmp_path / "sweep" / step["run_dir"] / "run.json").read_text())
        assert run["engine"] == "locust" and step["failed"] == 0
        assert step["completed"] >= 0.9 * step["load"] * step["duration_s"]


def test_each_step_sets_the_load_it_sweeps(known_scenario: Path, tmp_path: Path) -> None:
    from loadgen.run.sweep import step_scenario

    open_loop = api.load_scenario(known_scenario, overrides={"load.requests": 50})
    step = step_scenario(open_loop, "rate", 17.5, 9.0)
    assert (step.load.rate_per_s, step.load.duration_s, step.load.requests) == (17.5, 9.0, None)
    assert step.source is not None and step.source[0] == known_scenario  # Locust workers reload the same step
    closed = api.load_scenario(_ceiling_scenario(tmp_path))
    capped = step_scenario(closed, "rate", 12.0, 5.0)
    assert (capped.load.concurrency, capped.load.max_rate_per_s) == (8, 12.0)  # N users, never above R/s
    users = step_scenario(closed, "concurrency", 16, 5.0)
    assert (users.load.concurrency, users.load.max_rate_per_s) == (16, 10)  # the scenario's own ceiling holds
    in_code = type(closed).model_validate(closed.model_dump())  # built in code: no file to reload
    built = step_scenario(in_code, "concurrency", 4, 5.0)
    assert built.load.concurrency == 4 and built.source is None
