"""The fault matrix: loadgen against servers, inputs and machines that misbehave (the README's fault table).

Every case plants three secrets (an API key, a sensitive header, a password in the base URL) and checks, besides
its own outcome: the documented exit code, no traceback, no secret in stdout, stderr or any file of the run
directory, one record per request sent, and that the run ended within its stated bound (the scenario's time plus
its deadlines, with a fixed allowance for start-up and reports).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest

from tests.misbehaving_server import MisbehavingServer
from tests.run_helpers import run_cli, summary

API_KEY, HEADER_SECRET, URL_PASSWORD = "sk-fault-key-1f2e3d4c", "hdr-secret-9a8b7c6d", "pw-fault-6e5d4c3b"
SECRETS = (API_KEY, HEADER_SECRET, URL_PASSWORD)
STARTUP_ALLOWANCE_S = 25.0  # interpreter start, preflight and report writing around the run's own bound
DURATION_S, DRAIN_S = 2.0, 1.0

SCENARIO = f"""\
name: fault
target: {{base_url: embedded, ttft_timeout_s: 30, idle_timeout_s: 30}}
load: {{arrival: constant, rate_per_s: 4, duration_s: {DURATION_S}, drain_timeout_s: {DRAIN_S}}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: fixed, value: 8}}}}]
# The fault runs judge what loadgen does with a misbehaving server, not timing: 8 requests' p99 queue delay is their
# worst one, which a busy CI core (the default tier runs on every core) pushed past 10 ms (a PASS read INCONCLUSIVE).
slo: {{max_generator_lag_ms: 1000}}
"""


def assert_clean(res, out: Path | None) -> None:
    """No traceback, no planted secret anywhere the run wrote or printed."""
    text = res.stdout + res.stderr
    assert "Traceback" not in text, text[-3000:]
    for secret in SECRETS:
        assert secret not in text
        for path in (out.rglob("*") if out is not None and out.exists() else []):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), (secret, path.name)


def fault_run(server: MisbehavingServer, scenario: Path, out: Path, mode: str, *sets: str, bound_s: float,
              timeout: float = 120, engine: str = "asyncio"):
    """``loadgen run`` against MODE with the secrets planted; asserts the common contract, returns the result."""
    t0 = time.monotonic()
    res = run_cli("run", str(scenario), "--out", str(out), "--no-progress", "--no-png", "--engine", engine,
                  "--base-url", server.url(mode, f"tester:{URL_PASSWORD}@"), "--model", "m",
                  "--api-key-env", "LOADGEN_FAULT_KEY", "--set", "target.headers={X-Api-Key: " + HEADER_SECRET + "}",
                  *(x for s in sets for x in ("--set", s)), env={"LOADGEN_FAULT_KEY": API_KEY}, timeout=timeout)
    elapsed_s = time.monotonic() - t0
    assert elapsed_s <= bound_s + STARTUP_ALLOWANCE_S, f"ran {elapsed_s:.1f} s, bound {bound_s:g} s"
    assert_clean(res, out)
    if (out / "requests.parquet").exists():
        requests = pl.read_parquet(out / "requests.parquet")
        assert requests["seq"].n_unique() == requests.height == summary(out)["requests"]["sent"]
    return res


def kinds(out: Path) -> dict[str, int]:
    return summary(out)["requests"]["errors_by_kind"]


# ---- 1. hangs ----------------------------------------------------------------------------------------------
def test_a_server_that_never_answers_the_preflight_is_exit_2_within_its_deadline(server, scenario, tmp_path):
    out = tmp_path / "run"
    res = fault_run(server, scenario, out, "silent-all", "target.preflight_timeout_s=1", bound_s=1)
    assert res.returncode == 2
    assert "no answer within 1 s (target.preflight_timeout_s)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()  # no empty run directory left


@pytest.mark.slow
def test_a_token_every_half_second_forever_is_cut_at_the_runs_hard_end(server, scenario, tmp_path):
    out = tmp_path / "run"
    res = fault_run(server, scenario, out, "trickle", bound_s=DURATION_S + DRAIN_S)
    assert res.returncode == 3, res.stdout
    s = summary(out)
    assert s["verdict"] == "inconclusive" and kinds(out) == {"cancelled": s["requests"]["sent"]}
    assert s["requests"]["sent"] == 8
    messages = pl.read_parquet(out / "requests.parquet")["error_message"].unique().to_list()
    assert messages == [f"still in flight {DRAIN_S:g} s after the last send (load.drain_timeout_s): cut at the "
                        "run's end"]
    assert any("cancelled at the run's end" in n for n in s["notes"])


@pytest.mark.slow
def test_a_request_longer_than_request_timeout_s_is_timeout_request(server, scenario, tmp_path):
    out = tmp_path / "run"
    res = fault_run(server, scenario, out, "trickle", "target.request_timeout_s=1.5", "load.drain_timeout_s=30",
                    bound_s=DURATION_S + 1.5)
    assert res.returncode == 1
    assert kinds(out) == {"timeout_request": 8}


@pytest.mark.slow
def test_a_data_line_that_never_ends_is_a_protocol_error_not_unbounded_memory(server, scenario, tmp_path):
    out = tmp_path / "run"
    res = fault_run(server, scenario, out, "endless-line", "target.max_event_bytes=65536",
                    bound_s=DURATION_S + DRAIN_S)
    assert res.returncode == 1
    assert kinds(out) == {"protocol": 8}
    messages = pl.read_parquet(out / "requests.parquet")["error_message"].unique().to_list()
    assert messages == ["a line over 65536 bytes (target.max_event_bytes)"]


# ---- 2. no PASS without evidence ------------------------------------------------------------------------------
@pytest.mark.slow
def test_every_request_timing_out_is_fail_not_pass_without_an_error_rate_objective(server, scenario, tmp_path):
    out = tmp_path / "run"
    res = fault_run(server, scenario, out, "silent", "target.ttft_timeout_s=1", "load.drain_timeout_s=5",
                    bound_s=DURATION_S + 5)
    assert res.returncode == 1
    s = summary(out)
    assert s["verdict"] == "fail" and kinds(out) == {"timeout_ttft": 8} and s["requests"]["completed"] == 0
    rate = next(o for o in s["slo"] if o["objective"] == "error_rate.max")
    assert rate["passed"] is False and "default" in rate["note"]


@pytest.mark.slow
def test_http_500_for_every_request_fails_the_run(server, scenario, tmp_path):
    out = tmp_path / "run"
    assert fault_run(server, scenario, out, "fail", bound_s=DURATION_S).returncode == 1
    assert kinds(out) == {"http_5xx": 8}


@pytest.mark.slow
def test_a_healthy_server_passes_with_the_default_error_rate(server, scenario, tmp_path):
    out = tmp_path / "run"
    res = fault_run(server, scenario, out, "ok", bound_s=DURATION_S)
    assert res.returncode == 0, res.stdout
    assert summary(out)["requests"]["completed"] == 8


# ---- 3. secrets in the /metrics warning and preflight errors --------------------------------------------------
@pytest.mark.slow
def test_the_metrics_warning_masks_the_url_password(server, scenario, tmp_path):
    out = tmp_path / "run"
    res = fault_run(server, scenario, out, "ok", bound_s=DURATION_S)
    assert "server metrics:" in res.stdout and "tester:***@" in res.stdout
    assert any("tester:***@" in n for n in json.loads((out / "run.json").read_text())["notes"])


def test_a_preflight_error_masks_the_url_password(server, scenario, tmp_path):
    res = fault_run(server, scenario, tmp_path / "run", "models-list", bound_s=0)
    assert res.returncode == 2 and "not an OpenAI model list" in res.stderr and "tester:***@" in res.stderr


def test_connection_refused_masks_the_url_password(scenario, tmp_path):
    res = run_cli("run", str(scenario), "--out", str(tmp_path / "run"), "--no-progress",
                  "--base-url", f"http://tester:{URL_PASSWORD}@127.0.0.1:9/v1")
    assert res.returncode == 2 and "cannot reach" in res.stderr
    assert_clean(res, tmp_path / "run")


@pytest.mark.slow
def test_the_locust_engine_also_cuts_a_trickling_stream_at_the_runs_hard_end(server, scenario, tmp_path):
    out = tmp_path / "run"
    res = fault_run(server, scenario, out, "trickle", bound_s=DURATION_S + DRAIN_S, engine="locust")
    assert res.returncode == 3, res.stdout + res.stderr
    s = summary(out)
    assert kinds(out) == {"cancelled": 8} and any("cancelled at the run's end" in n for n in s["notes"])
