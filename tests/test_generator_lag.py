"""The generator-lag rule counts loadgen's own lateness only (analysis/generator_lag.py): a send held by a full
``load.max_in_flight`` waited for the server, and the run is judged on its objectives with a note saying the cap
was the limit; a send late while a slot was free is the client's, and the run stays INCONCLUSIVE. And a request
cancelled after waiting longer than a latency limit has missed it (a censored value, analysis/objective_samples.py):
a dead endpoint FAILs. The overload and slow-client cases run the simulator's scheduler in virtual time."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings, strategies as st

from loadgen import api
from loadgen.analysis.generator_lag import cap_full_share, cap_note, client_lag_ms, lag_figures, process_caps
from loadgen.analysis.summary import summarize
from loadgen.core.records import RequestRecord
from loadgen.records.schema import chunks_frame, requests_frame
from tests.conftest import scenario_file
from tests.virtual_truth import virtual_run

MS = 1_000_000
ONE_CLASS = """\
name: one
target: {base_url: "http://127.0.0.1:9/v1", model: m}
load: {arrival: constant, rate_per_s: 1, duration_s: 10, warmup_s: 0}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 16}, output_tokens: {dist: fixed, value: 8}}]
slo: {ttft_ms: {p99: 2000}, max_generator_lag_ms: 1000}
"""


def _frame(rows: list[tuple[int, int, int, int | None]]) -> pl.DataFrame:
    """(worker, t_intended, t_sent, t_done) in ms → the records' columns in ns."""
    return pl.DataFrame({"worker": [r[0] for r in rows], "t_intended_ns": [r[1] * MS for r in rows],
                         "t_sent_ns": [r[2] * MS for r in rows],
                         "t_done_ns": [None if r[3] is None else r[3] * MS for r in rows]},
                        schema={"worker": pl.Int64, "t_intended_ns": pl.Int64, "t_sent_ns": pl.Int64,
                                "t_done_ns": pl.Int64})


def test_a_send_the_full_cap_held_is_not_the_clients_lag_and_a_late_send_with_a_slot_free_is() -> None:
    rows = [(0, 0, 0, 100), (0, 0, 0, 200),  # the cap of 2 full from 0 to 100
            (0, 10, 101, 300),  # due at 10, a slot came free at 100: 1 ms of its 91 ms its own
            (0, 20, 250, 350),  # due at 20, the next slot free at 200: sent 50 ms after it, loadgen's lateness
            (0, 400, 405, 500),  # a slot free when due: its whole 5 ms queue delay its own
            (0, 30, 260, 260)]  # cut at 260 while the cap was full (never sent): no lateness of loadgen's
    assert client_lag_ms(_frame(rows), 2).to_list() == [0.0, 0.0, 1.0, 50.0, 5.0, 0.0]
    assert client_lag_ms(_frame(rows), 256).to_list() == [0.0, 0.0, 91.0, 230.0, 5.0, 230.0]  # never full
    assert cap_full_share(_frame(rows), 2, 1, 0, 500 * MS) == 249 / 500  # [0, 100) [101, 200) [250, 300)


def test_each_sending_process_has_its_share_of_the_cap() -> None:
    """--workers 2 deals a cap of 3 as 2 + 1 (plan/shares.py): process 1 is full with one request in flight."""
    assert process_caps(3, 2) == [2, 1] and process_caps(256, 1) == [256]
    rows = [(0, 0, 0, 100), (0, 10, 10, 100), (1, 0, 0, 100), (1, 10, 100, 150)]
    assert client_lag_ms(_frame(rows), 3, processes=2).to_list() == [0.0, 0.0, 0.0, 0.0]
    assert client_lag_ms(_frame(rows), 3, processes=1).to_list() == [0.0, 0.0, 0.0, 90.0]


def test_a_request_the_runs_end_cut_before_it_was_sent_has_no_lag_of_its_own() -> None:
    """The hard end cancels the requests in flight, then those waiting for a slot, stamping each waiter's send
    at its cancel: slots free by then, but the waiters were never late, never sent."""
    rows = [(0, 0, 0, 1000), (0, 10, 1000, 1000), (0, 20, 1000, 1000)]  # cap 1; the last two cut waiting
    frame = _frame(rows).with_columns(error_kind=pl.Series([None, "cancelled", "cancelled"], dtype=pl.String))
    assert client_lag_ms(frame, 1).to_list() == [0.0, None, None]


def test_a_request_still_held_at_the_records_end_keeps_its_slot() -> None:
    rows = [(0, 0, 0, None), (0, 5, 50, 60)]  # the first never ended (a killed run): the cap of 1 stays full
    assert client_lag_ms(_frame(rows), 1).to_list() == [0.0, 0.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 40), st.integers(1, 60)), min_size=1, max_size=30),
       st.integers(1, 6))
def test_the_client_lag_is_at_most_the_queue_delay_and_is_it_where_the_cap_never_fills(
        draws: list[tuple[int, int, int]], cap: int) -> None:
    rows = [(0, due, due + late, due + late + took) for due, late, took in draws]
    frame = _frame(rows)
    queue = [float(r[2] - r[1]) for r in rows]
    lag = client_lag_ms(frame, cap).to_list()
    assert all(0.0 <= own <= q for own, q in zip(lag, queue))
    assert client_lag_ms(frame, len(rows) + 1).to_list() == queue


def test_an_open_loop_run_at_three_times_capacity_fails_on_its_objectives_not_on_the_generator() -> None:
    """scenarios/chat.yaml at 75 req/s (the simulator's capacity ≈ 25) with max_in_flight 256: the cap fills,
    the queue delay reaches seconds, and the run FAILs naming its objectives; the note says the cap was full."""
    v = virtual_run("scenarios/chat.yaml", ["load.rate_per_s=75", "load.duration_s=12", "load.warmup_s=1"])
    s = v.summary
    lag = s["generator_lag"]
    assert s["verdict"] == "fail", s["reasons"]
    assert any(r.startswith("ttft_ms.p99 = ") for r in s["reasons"]) and not any("lagged" in r for r in s["reasons"])
    assert lag["queue_delay_p99_ms"] > 1000 and lag["client_lag_p99_ms"] <= lag["limit_ms"]
    assert lag["max_in_flight"] == 256 and lag["cap_full_share"] > 0.5
    note = next(r for r in s["reasons"] if r.startswith("load.max_in_flight (256) was full for "))
    assert "a slot the server held" in note and "measured from the intended send" in note


def test_a_run_whose_loop_was_blocked_is_still_inconclusive_for_generator_lag() -> None:
    """loadgen's loop blocked 400 ms every 2 s (the slow-client knob, in virtual time) with the cap never full:
    the sends are late by loadgen's own doing."""
    hogs = tuple((k * 2_000 * MS, (k * 2_000 + 400) * MS) for k in range(1, 6))
    v = virtual_run("scenarios/chat.yaml", ["load.rate_per_s=10", "load.duration_s=10", "load.warmup_s=1"], hogs)
    s = v.summary
    assert s["verdict"] == "inconclusive"
    assert s["reasons"][0].startswith("the generator lagged: p99 client_lag_ms ")
    assert s["generator_lag"]["client_lag_p99_ms"] > 100 and s["generator_lag"]["cap_full_share"] == 0.0


def test_a_process_with_more_in_flight_than_its_share_of_the_cap_counts_its_whole_queue_delay() -> None:
    """Process 1's share of a cap of 3 over 2 processes is 1, yet it held 3 requests at once (its worker index not
    the plan's, or the processes count missing): the cap model did not hold there, so none of its queue delay is
    put down to a full cap; process 0 (within its share of 2) keeps the model, and the reasons say which did not."""
    rows = [(0, 0, 0, 100), (0, 10, 10, 100), (0, 20, 100, 150),  # process 0: cap 2, full 10–100
            (1, 0, 0, 100), (1, 0, 5, 100), (1, 0, 30, 100)]  # process 1: cap 1, 3 in flight by 30
    frame = _frame(rows).with_columns(warmup=pl.lit(False), queue_delay_ms=pl.Series([0.0, 0, 80, 0, 5, 30]))
    assert client_lag_ms(frame, 3, processes=2).to_list() == [0.0, 0.0, 0.0, 0.0, 5.0, 30.0]
    figures = lag_figures(frame, 3, 2, 10.0)
    assert figures["cap_exceeded_processes"] == [1]
    note = cap_note(figures)
    assert note is not None and note.startswith("sending process(es) 1 had more requests in flight than their "
                                                "share of load.max_in_flight (3 over 2 process(es))")
    assert "the per-process cap model did not hold" in note
    roomy = lag_figures(frame, 6, 2, 10.0)  # shares of 3 and 3: the model holds
    assert roomy["cap_exceeded_processes"] == [] and cap_note(roomy) is None


def test_the_lag_blocks_queue_delay_p99_is_the_summarys_queue_delay_p99(tmp_path: Path) -> None:
    """One figure, one value: summary.json's generator_lag.queue_delay_p99_ms is metrics.queue_delay_ms.p99 (both
    linear between ranks), here 10 requests queued 0, 100, …, 900 ms: p99 891 ms, not the nearest rank's 900."""
    records = [RequestRecord(i, "c", False, 1000 * i * MS, (1000 * i + 100 * i) * MS, (1000 * i + 100 * i + 5) * MS,
                             (1000 * i + 100 * i + 9) * MS, (1000 * i + 100 * i + 10) * MS, 16, 16, "asked", 8, 8,
                             "local", 2, http_status=200) for i in range(10)]
    scenario = api.load_scenario(scenario_file(tmp_path, ONE_CLASS), ["load.steady_state=declared"])
    s, _ = summarize(scenario, requests_frame(records), chunks_frame([]), len(records))
    assert s["metrics"]["queue_delay_ms"]["p99"] == s["generator_lag"]["queue_delay_p99_ms"] == pytest.approx(891.0)
