"""Steady state (analysis/steady.py): MSER-5 cuts a known warm-up or drain where it is, a steady series loses
nothing (over many seeds), an overload is flagged as never steady, and a run's figures, summary and timeline
take the window — in virtual time (the simulator's scheduler, tests/virtual_truth.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from loadgen import api
from loadgen.analysis import steady as st
from loadgen.analysis.compare import run_samples
from loadgen.analysis.result import RunResult
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.summary import summarize
from loadgen.report import timeline as tl
from loadgen.report.charts import build_charts
from loadgen.report.views import RunViews

from tests.virtual_truth import virtual_run

MS = 1_000_000
GAP_NS = 100 * MS  # one intended send every 100 ms


def frame(e2e_ms: np.ndarray, ok: np.ndarray | None = None, classes: list[str] | None = None) -> pl.DataFrame:
    """The columns steady.detect reads: one request per latency, sent every 100 ms."""
    n = len(e2e_ms)
    return pl.DataFrame({"t_intended_ns": np.arange(n, dtype=np.int64) * GAP_NS, "e2e_ms": e2e_ms,
                         "ok": np.ones(n, bool) if ok is None else ok,
                         "class_name": classes or ["a"] * n})


def lognormal(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(np.log(500.0), 0.6, n)


def test_mser_is_whites_statistic() -> None:
    z = np.random.default_rng(1).normal(size=40)
    direct = [float(((z[d:] - z[d:].mean()) ** 2).sum() / (40 - d) ** 2) for d in range(21)]
    assert np.allclose(st.mser(z, 20), direct)


@pytest.mark.parametrize("seed", range(30))
def test_a_steady_series_loses_no_request(seed: int) -> None:
    w = st.detect(frame(lognormal(seed, 1000)))
    assert (w.warmup, w.drain, w.start_ns, w.end_ns, w.reached) == (0, 0, None, None, True), w.reason


def test_one_slow_request_at_the_start_is_not_a_warm_up() -> None:
    e2e = lognormal(3, 600)
    e2e[:3] *= 1000  # a few outliers (a cold cache, one long stall): ranks, not a transient
    w = st.detect(frame(e2e))
    assert (w.warmup, w.drain, w.reached) == (0, 0, True), w.reason


@pytest.mark.parametrize("seed", range(5))
def test_a_cold_start_is_cut_where_it_ends(seed: int) -> None:
    e2e = lognormal(seed, 1200)
    e2e[:60] *= 3.0  # the first 60 requests (6 s) three times slower
    w = st.detect(frame(e2e))
    assert 55 <= w.warmup <= 75 and w.drain == 0 and w.reached, w
    assert w.start_ns == w.warmup * GAP_NS  # the first request kept starts the window
    assert w.as_dict()["start_s"] == pytest.approx(w.warmup * 0.1)
    assert w.as_dict()["transient_requests"] == w.warmup


def test_a_drain_is_cut_from_the_end() -> None:
    e2e = lognormal(8, 1000)
    e2e[-100:] *= 0.3  # the last 100 requests ran on an emptying server
    w = st.detect(frame(e2e))
    assert w.warmup == 0 and 90 <= w.drain <= 110 and w.reached, w
    assert w.end_ns == (999 - w.drain) * GAP_NS and w.start_ns is None


def test_failed_requests_sent_in_the_warm_up_are_cut_with_it() -> None:
    e2e = lognormal(4, 1000)
    e2e[:80] *= 4.0
    ok = np.ones(1000, bool)
    ok[[10, 20, 30]] = False  # failed: not in the series, but sent during the warm-up
    w = st.detect(frame(e2e, ok))
    cut = frame(e2e, ok).filter(w.outside(pl.col("t_intended_ns")))
    assert w.warmup == cut.height and cut.filter(~pl.col("ok")).height == 3, w


def test_the_series_is_ranked_within_each_class() -> None:
    # two classes a hundred times apart, interleaved: no transient, only a mix
    rng = np.random.default_rng(5)
    classes = ["short" if x else "long" for x in rng.random(1000) < 0.5]
    e2e = lognormal(5, 1000) * np.where(np.array(classes) == "long", 100.0, 1.0)
    w = st.detect(frame(e2e, classes=classes))
    assert (w.warmup, w.drain, w.reached) == (0, 0, True)


def test_an_overload_never_reaches_steady_state_and_keeps_every_request() -> None:
    e2e = np.linspace(200, 20_000, 1000) * np.random.default_rng(2).lognormal(0, 0.3, 1000)  # a growing queue
    w = st.detect(frame(e2e))
    assert (w.warmup, w.drain, w.reached) == (0, 0, False)
    assert "half the run" in w.reason


def test_too_few_requests_say_nothing() -> None:
    e2e = lognormal(1, st.MIN_BATCHES * st.BATCH - 1)
    e2e[:20] *= 5
    w = st.detect(frame(e2e))
    assert (w.warmup, w.drain, w.reached) == (0, 0, None) and "needs 100" in w.reason


# ---- a run in virtual time ---------------------------------------------------------------------------
BURST = ["load.arrival=stages", "load.rate_per_s=null", "load.duration_s=null", "load.warmup_s=0",
         'load.stages=[{"duration_s": 2, "rate_per_s": 60}, {"duration_s": 60, "rate_per_s": 6}]']


@pytest.fixture(scope="module")
def burst() -> object:
    """chat.yaml's server flooded for 2 s (120 requests), then at 6 req/s for 60 s: a queue that drains."""
    return virtual_run("scenarios/chat.yaml", BURST)


def test_a_flooded_start_is_cut_from_the_figures(burst) -> None:
    steady = burst.summary["steady_state"]
    assert steady["method"] == "mser-5" and steady["reached"] is True
    assert 100 <= steady["warmup_requests"] <= 200 and steady["drain_requests"] == 0
    assert steady["start_s"] > 2.0  # past the flood: the queue it left has drained
    declared = RunAnalysis(burst.requests, burst.chunks, "declared")
    detected = RunAnalysis(burst.requests, burst.chunks)
    assert declared.measured.height - detected.measured.height == steady["transient_requests"]
    assert int(detected.req["transient"].sum()) == steady["transient_requests"]
    ttft = burst.summary["metrics"]["ttft_ms"]
    assert ttft["count"] == detected.measured.height
    assert ttft["p99"] < declared.measured.filter(pl.col("ok"))["ttft_ms"].quantile(0.99) / 5


def test_compare_samples_the_same_window(burst) -> None:
    run = RunAnalysis(burst.requests, burst.chunks)
    samples = run_samples(burst.requests, burst.chunks, burst.stalls, run)
    assert samples.n == run.measured.height < burst.requests.height
    assert len(samples.itl_ms) == run.token_stats()["itl_ms"]["count"] and samples.itl_request.max() < samples.n
    assert np.nanquantile(samples.ttft_ms, 0.99) == pytest.approx(burst.summary["metrics"]["ttft_ms"]["p99"])


def test_the_timeline_shades_the_cut_warm_up(burst) -> None:
    run = RunAnalysis(burst.requests, burst.chunks)
    views = RunViews.build(burst.requests, burst.chunks, burst.stalls, RunResult.from_dict(burst.summary), run=run)
    spans = tl.excluded_spans(views)
    steady = burst.summary["steady_state"]
    assert spans.rows() == [(0.0, pytest.approx(steady["start_s"]), "detected warm-up", steady["warmup_requests"])]
    assert tl.excluded_spans(views, 1.0, 2.0)["start_s"].to_list() == [1.0]  # clipped to a window
    charts = {c.key: c for c in build_charts(views, tl.Window(0.0, 6.0, "the run's first seconds"))}
    for key in ("timeline", "itl_over_time"):
        assert "detected warm-up" in str(charts[key].spec(validate=True)) and "Grey" in charts[key].note


def test_a_steady_run_in_virtual_time_keeps_every_figure() -> None:
    overrides = ["load.duration_s=40", "load.steady_state=declared"]
    v = virtual_run("scenarios/chat.yaml", overrides[:1])
    assert v.summary["steady_state"]["transient_requests"] == 0 and v.summary["steady_state"]["reached"]
    scenario = api.load_scenario("scenarios/chat.yaml", overrides)
    run = RunAnalysis(v.requests, v.chunks, scenario.load.steady_state)
    declared, _ = summarize(scenario, v.requests, v.chunks, v.summary["requests"]["planned"], run=run)
    assert declared["steady_state"]["method"] == "declared" and declared["steady_state"]["reached"] is None
    assert v.summary["metrics"] == declared["metrics"] and v.summary["requests"] == declared["requests"]
    views = RunViews.build(v.requests, v.chunks, v.stalls, RunResult.from_dict(v.summary), run=run)
    spans = tl.excluded_spans(views)  # the declared 5 s warm-up only, before the origin: drawn on no chart
    assert spans["what"].to_list() == ["declared warm-up"] and spans["end_s"].to_list() == [0.0]
    assert spans["requests"].to_list() == [int(v.requests["warmup"].sum())]
    charts = build_charts(views, tl.Window(0.0, 6.0, "the run's first seconds"))
    assert not any("Grey" in c.note for c in charts)
