"""Reasoning against the embedded simulator's truth (issue 38): a short run of scenarios/reasoning.yaml with the
simulator's trace on. Each request's time to first answer token is the simulator's (the write of the first
answer token, from the request's arrival) within 3 ms plus the run's own lateness, and its reasoning and answer
token counts are the simulator's exactly; with the reasoning stream's own field (SGLang's, llama.cpp's
``reasoning_content``) and with the boundary chunk carrying the last thought and the first answer token at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from local_target.sim import read_trace
from tests.run_helpers import SIM_TRACE, records, run_cli, summary

pytestmark = pytest.mark.timing
SAMPLER_PERIOD_NS = 100_000_000  # a lag is sampled when the sampler's 50-ms timer fires after it: look this far on

SHORT = ("--set", "load.duration_s=5", "--set", "load.warmup_s=0", "--set", "load.rate_per_s=6",
         "--set", "load.steady_state=declared", "--set", "target.simulator.time_scale=0.2")


@pytest.fixture(scope="module", params=[False, True], ids=["reasoning_content", "mixed_boundary"])
def reasoned(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reasoning") / "run"
    mixed = str(request.param).lower()
    res = run_cli("run", "scenarios/reasoning.yaml", "--out", str(out), "--no-progress", "--no-png", *SHORT,
                  "--set", f"target.simulator.reasoning.mixed_boundary={mixed}", *SIM_TRACE)
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr
    return out


def truth(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Per request id: arrival, the finish event's counts, and when the first answer token was written."""
    out: dict[str, dict[str, Any]] = {}
    writes: dict[tuple[str, int], int] = {}
    for e in read_trace(run_dir / "sim_trace.jsonl"):
        if e["type"] == "request":
            out[e["id"]] = {"arrival": e["t_arrival_ns"]}
        elif e["type"] == "step":
            writes.update(((rid, index), t_write) for rid, index, t_write in e["tokens"])
        elif e["type"] == "finish":
            out[e["id"]].update(e)
    for rid, t in out.items():
        first = t.get("first_answer_index")
        t["first_answer_write"] = writes.get((rid, first)) if first is not None else None
    return out


def test_time_to_first_answer_token_is_the_simulators_within_3_ms(reasoned: Path) -> None:
    req, _ = records(reasoned)
    t = truth(reasoned)
    done = req.filter(pl.col("error_kind").is_null() & (pl.col("reasoning_tokens") > 0))
    assert done.height >= 8, req.select("class_name", "error_kind", "reasoning_tokens")
    # 3 ms of loopback and parsing (2 ms was missed once by 0.47 ms in a clean-clone CI run: 2.50 ms, its worst),
    # plus the client's own lateness in this run (the loop late by X ms at its sends reads up to X ms late too:
    # queue_delay_ms p99, measured), as tests/test_conversations.py allows, plus the loop's lag loadgen's own
    # sampler recorded while that request was read (client_metrics.parquet, lags of 2 ms and more: a read waits
    # for a busy loop; stamps independent of the loop are issue 41's, not this test's)
    base_ms = 3.0 + summary(reasoned)["metrics"]["queue_delay_ms"]["p99"]
    lag = pl.read_parquet(reasoned / "client_metrics.parquet").filter(pl.col("name") == "loop_lag_ms")
    worst_ms = 0.0
    for rid, sent, first_answer in done.select("request_id", "t_sent_ns", "t_first_answer_ns").iter_rows():
        truth_ms = (t[rid]["first_answer_write"] - t[rid]["arrival"]) / 1e6
        measured_ms = (first_answer - sent) / 1e6
        read_lag_ms = lag.filter(pl.col("t_ns").is_between(sent, first_answer + SAMPLER_PERIOD_NS))["value"].max()
        tolerance_ms = base_ms + float(read_lag_ms or 0.0)
        worst_ms = max(worst_ms, abs(measured_ms - truth_ms))
        assert abs(measured_ms - truth_ms) <= tolerance_ms, (rid, measured_ms, truth_ms, tolerance_ms)
    print(f"time to first answer token: worst |measured - truth| {worst_ms:.2f} ms over {done.height} requests "
          f"(tolerance {base_ms:.2f} ms + the loop's lag while each was read)")


def test_reasoning_and_answer_token_counts_are_the_simulators_exactly(reasoned: Path) -> None:
    req, _ = records(reasoned)
    t = truth(reasoned)
    done = req.filter(pl.col("error_kind").is_null())
    assert done.height >= 16 and (done["reasoning_tokens"] > 0).any() and (done["reasoning_tokens"] == 0).any()
    for rid, reasoning, output in done.select("request_id", "reasoning_tokens", "output_tokens").iter_rows():
        assert (reasoning, output - reasoning) == (t[rid]["reasoning_tokens"], t[rid]["answer_tokens"]), rid
    s = summary(reasoned)["reasoning"]
    assert s["reasoning_tokens"] + s["answer_tokens"] == int(done.filter(~pl.col("warmup"))["output_tokens"].sum())
