"""``loadgen run`` end to end against the embedded simulator (child process, loopback)."""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time

import polars as pl
import pytest

from tests.run_helpers import ROOT, SIM_TRACE, records, run_cli, summary, trace_per_request

SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
# Bundled scenarios that another test already runs end to end with `loadgen run` (CI time: each run here costs
# 10-20 s of process start, run, analysis and report); test_every_scenario_is_run_somewhere keeps this honest.
RUN_ELSEWHERE = {
    "aggressor_victim": "tests/test_spike_truth.py",  # 30 s, attribution scored against the trace
    "chat": "tests/conftest.py",  # preemption_heavy_run: test_spike_truth and test_server_metrics
    "smoke": "tests/test_api.py",  # and in most CLI tests
    "long_context": "tests/test_newcomer.py",  # copied out of the built wheel and run, PNG charts and all
    "multi_turn": "tests/test_conversations.py",  # TTFT by turn against the truth
    "nightly": "tests/test_ci_outputs.py",  # the workflow's own steps
    "reasoning": "tests/test_reasoning_truth.py",  # time to first answer token against the truth
    "agentic": "tests/conftest.py",  # agentic_short_run: the truth tests and the session lane in chromium
    "vllm_cpu": "tests/test_vllm_cpu.py",  # against a real vLLM (CPU build)
    "llamacpp_cpu": "tests/test_llamacpp.py",  # against a real llama-server
}
# runs of a few seconds test timing and records, not the verdict's statistics: decided on point values (a p90
# of 12 requests has no 95% upper bound; docs/verdicts.md)
LOW_LOAD = ["--set", "load.arrival=constant", "--set", "load.rate_per_s=4", "--set", "load.warmup_s=0",
            "--set", "slo.decision=point", "--no-progress", "--no-png"]


@pytest.mark.timing
def test_low_load_timings_match_the_simulator_trace(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "6", *LOW_LOAD, *SIM_TRACE)
    assert res.returncode == 0, res.stderr
    requests, chunks = records(out)
    trace = trace_per_request(out)
    ttft_diffs, itl_diffs = [], []
    for row in requests.iter_rows(named=True):
        truth = trace[row["request_id"]]
        emitted = [truth["tokens"][i][0] for i in sorted(truth["tokens"])]
        trace_ttft_ms = (emitted[0] - truth["arrival"]) / 1e6
        ttft_diffs.append((row["t_first_token_ns"] - row["t_sent_ns"]) / 1e6 - trace_ttft_ms)
        times = chunks.filter(pl.col("seq") == row["seq"])["t_ns"].to_list()
        client_itl = statistics.median((b - a) / 1e6 for a, b in zip(times, times[1:]))
        trace_itl = statistics.median((b - a) / 1e6 for a, b in zip(emitted, emitted[1:]))
        itl_diffs.append(client_itl - trace_itl)
    assert len(ttft_diffs) >= 20
    assert abs(statistics.median(ttft_diffs)) <= 1.0
    assert max(abs(d) for d in itl_diffs) <= 1.0  # every request's median ITL within 1 ms of the truth
    assert summary(out)["lengths"]["prompt"]["exact"] == requests.height  # asked == achieved via /tokenize


@pytest.mark.slow
def test_coalesced_chunks_split_chunk_gap_from_itl(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "4",
                  "--set", "target.simulator.max_chunk_tokens=4", "--set", "target.continuous_usage_stats=false",
                  *LOW_LOAD)
    assert res.returncode == 0, res.stderr
    s = summary(out)["metrics"]
    _, chunks = records(out)
    assert chunks["tokens"].max() == 4 and chunks["tokens"].min() >= 1
    assert not (out / "sim_trace.jsonl").exists()  # the simulator's trace is written only when asked for
    assert s["chunk_gap_ms"]["p50"] == pytest.approx(4 * s["itl_ms"]["p50"], rel=0.05)
    assert s["itl_ms"]["p50"] == pytest.approx(7.6, abs=0.5)  # the preset's decode step, not 4x it


@pytest.mark.parametrize("args, message", [
    (["run", "scenarios/smoke.yaml", "--set", "load.rate_per_s=-3"], "load.rate_per_s"),
    (["run", "scenarios/smoke.yaml", "--base-url", "http://127.0.0.1:9/v1"], "cannot reach http://127.0.0.1:9"),
    (["run", "scenarios/smoke.yaml", "--model", "no-such-model"], "'no-such-model' is not served"),
    (["run", "scenarios/smoke.yaml", "--api-key-env", "LOADGEN_UNSET_VAR"], "LOADGEN_UNSET_VAR is not set"),
    (["run", "scenarios/nope.yaml"], "cannot read"),
])
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, args, message):
    res = run_cli(*args, "--out", str(tmp_path / "run"), "--no-progress")
    assert res.returncode == 2
    assert message in res.stderr and "Traceback" not in res.stderr + res.stdout
    assert len(res.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "run").glob("*.parquet"))  # nothing was sent


def test_out_dir_holding_a_run_is_refused_not_mixed(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    pl.DataFrame({"seq": [1]}).write_parquet(out / "requests.parquet")
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--no-progress")
    assert res.returncode == 2 and "already holds a run" in res.stderr
    assert pl.read_parquet(out / "requests.parquet").height == 1 and not (out / "run.json").exists()


@pytest.mark.slow
def test_server_errors_mid_run_are_counted_not_raised(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "5", *LOW_LOAD,
                  "--set", "target.simulator.time_scale=0.3",
                  "--set", "target.simulator.faults={error_rate: 0.2, disconnect_rate: 0.2, malformed_rate: 0.2}")
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr + res.stdout
    s = summary(out)
    kinds = s["requests"]["errors_by_kind"]
    assert kinds.get("http_5xx", 0) > 0 and kinds.get("protocol", 0) > 0
    assert s["requests"]["failed"] == sum(kinds.values()) and s["requests"]["completed"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["asyncio", "locust"])
def test_ctrl_c_leaves_readable_records_and_a_summary(tmp_path, engine):
    """Either driver: Ctrl-C mid-run keeps every record taken (the Locust driver used to drop the run, and the
    records not yet flushed, on the way out) and reports the run as interrupted."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", "scenarios/smoke.yaml", "--out", str(out),
                             "--duration", "60", "--set", "load.warmup_s=0", "--no-progress", "--no-png", "--engine",
                             engine],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(out.glob("requests.part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the first flushed batch, not timing anything
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr and proc.returncode in (0, 1, 3)
    requests, _ = records(out)
    s = summary(out)
    assert s["interrupted"] and s["verdict"] != "pass" and s["requests"]["completed"] > 0
    assert requests.height == s["requests"]["sent"] and requests.height < 200


@pytest.mark.slow
def test_api_key_never_reaches_files_or_console(tmp_path):
    secret = "sk-loadgen-test-5f3c1a9e77"
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "2", "--api-key-env",
                  "LOADGEN_TEST_KEY", "--set", "target.headers={X-Api-Key: " + secret + "}", *LOW_LOAD,
                  env={"LOADGEN_TEST_KEY": secret})
    assert res.returncode in (0, 3), res.stderr  # 2 s is too short for some percentiles: inconclusive is fine
    assert secret not in res.stdout + res.stderr
    for path in out.iterdir():
        assert secret.encode() not in path.read_bytes(), path.name


@pytest.mark.slow
def test_a_password_in_the_base_url_never_reaches_files_or_console(tmp_path):
    from local_target.sim import build_config, start_simulator

    secret = "pw-loadgen-test-8d2e"
    out = tmp_path / "run"
    with start_simulator(build_config("a100-llama-7b")) as sim:
        url = sim.base_url.replace("http://", f"http://tester:{secret}@")
        res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "2", "--base-url", url,
                      *LOW_LOAD)
    assert res.returncode in (0, 3), res.stderr
    assert secret not in res.stdout + res.stderr
    for path in out.iterdir():
        assert secret.encode() not in path.read_bytes(), path.name
    assert "tester:***@" in (out / "run.json").read_text()


def test_redact_url_masks_passwords_and_key_query_values():
    from loadgen.core.secrets import redact_url

    assert redact_url("http://u:p4ss@h:8000/v1?api_key=k123&x=1") == "http://u:***@h:8000/v1?api_key=***&x=1"
    assert redact_url("http://h:8000/v1") == "http://h:8000/v1" and redact_url("embedded") == "embedded"


@pytest.mark.slow
@pytest.mark.parametrize("engine", [[], ["--engine", "locust", "--workers", "2"]], ids=["asyncio", "locust-workers"])
def test_closed_loop_keeps_concurrency(tmp_path, engine):
    """The scenario's concurrency is the run's, however many Locust workers share it (each once ran all of it)."""
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--no-progress", "--no-png", "--set",
                  "load={arrival: concurrency, concurrency: 4, duration_s: 3}", "--set",
                  "target.simulator.time_scale=0.3", "--set", "slo.decision=point", *engine)
    assert res.returncode == 0, res.stderr
    requests, _ = records(out)
    assert requests.height >= 20
    events = sorted([(t, 1) for t in requests["t_sent_ns"]] + [(t, -1) for t in requests["t_done_ns"]])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak == 4


@pytest.mark.slow
def test_a_full_in_flight_cap_is_the_servers_wait_not_generator_lag(tmp_path):
    """30 requests one at a time (max_in_flight 1): each waits for the slot the server holds. That wait counts in
    ttft_ms (from the intended send), so the run is judged and FAILs, saying the cap was the limit; it is not the
    generator's lateness (issue 51: a loop blocked on purpose stays INCONCLUSIVE, tests/test_generator_lag.py)."""
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "1", *LOW_LOAD,
                  "--set", "load.rate_per_s=30", "--set", "load.max_in_flight=1")
    assert res.returncode == 1, res.stdout
    s = summary(out)
    assert s["verdict"] == "fail" and not any("lagged" in r for r in s["reasons"])
    assert any(r.startswith("load.max_in_flight (1) was full for") for r in s["reasons"]), s["reasons"]
    assert s["generator_lag"]["client_lag_p99_ms"] < s["generator_lag"]["queue_delay_p99_ms"]


@pytest.mark.slow
def test_idle_timeout_is_recorded(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "3", *LOW_LOAD,
                  "--set", "target.idle_timeout_s=0.5",
                  "--set", "target.simulator.faults={stall_ms: 1500, stall_every_s: 1}")
    assert res.returncode in (0, 1), res.stderr
    assert summary(out)["requests"]["errors_by_kind"].get("timeout_idle", 0) > 0


@pytest.mark.slow
def test_report_rebuilds_the_same_summary(tmp_path):
    out = tmp_path / "run"
    assert run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "3", *LOW_LOAD).returncode == 0
    before = summary(out)
    (out / "summary.json").unlink()
    (out / "summary.md").unlink()
    res = run_cli("report", str(out))
    assert res.returncode == 0 and summary(out)["metrics"] == before["metrics"]
    assert (out / "summary.md").exists() and (out / "junit.xml").exists()


def test_every_scenario_is_run_somewhere():
    """Each bundled scenario is run end to end: here, or by the test RUN_ELSEWHERE names, which must name it."""
    for path in SCENARIOS:
        where = RUN_ELSEWHERE.get(path.stem)
        if where is not None:
            text = (ROOT / where).read_text()
            assert f"scenarios/{path.name}" in text or f'"{path.name}"' in text, (path.name, where)
            assert "run_cli(\"run\"" in text or "run_scenario(" in text or "api.run(" in text, where
    assert set(RUN_ELSEWHERE) <= {p.stem for p in SCENARIOS}, "RUN_ELSEWHERE names a scenario that is gone"


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in SCENARIOS if p.stem not in RUN_ELSEWHERE], ids=lambda p: p.stem)
def test_every_scenario_runs(tmp_path, path):
    """Each bundled scenario not run elsewhere (the README's main job among them, with its PNG charts),
    shortened: a trace has no duration to shorten, so it is replayed faster (its 120 requests took 28 s at their
    own pace), and conversations think 0.5 s between turns instead of 2 (the sharegpt plan's last turn 6 s in
    instead of 12)."""
    out = tmp_path / "run"
    main_job = path.name == "long_context.yaml"
    faster = ["--set", "load.trace.speedup=5"] if path.name == "mooncake.yaml" else \
        ["--set", "workload.classes.1.conversation.think_time_s=0.5"] if path.name == "sharegpt.yaml" else []
    res = run_cli("run", str(path), "--out", str(out), "--duration", "4", "--set", "load.warmup_s=1", "--no-progress",
                  *faster, *([] if main_job else ["--no-png"]))
    assert res.returncode in (0, 1, 3), res.stderr
    assert {"requests.parquet", "chunks.parquet", "run.json", "summary.json", "summary.md", "junit.xml",
            "report.html", *(["charts"] if main_job else [])} <= {p.name for p in out.iterdir()}
    assert "verdict:" in res.stdout
