"""Metrics and the verdict, on hand-made records."""

from __future__ import annotations

import pytest

from loadgen.analysis import metrics as m
from loadgen.analysis.slo import Objective, evaluate, min_samples, verdict
from loadgen.core import ChunkRecord, RequestRecord
from loadgen.plan.slo_spec import Slo
from loadgen.records.schema import chunks_frame, requests_frame

MS = 1_000_000


def _req(seq, intended, sent, chunk_times, tokens, error=None, warmup=False, cls="a"):
    chunks = [ChunkRecord(seq, t * MS, n) for t, n in zip(chunk_times, tokens)]
    record = RequestRecord(seq=seq, class_name=cls, warmup=warmup, t_intended_ns=intended * MS,
                           t_sent_ns=sent * MS, t_first_token_ns=chunk_times[0] * MS if chunk_times else None,
                           t_last_token_ns=chunk_times[-1] * MS if chunk_times else None,
                           t_done_ns=(chunk_times[-1] if chunk_times else sent) * MS + MS,
                           prompt_tokens_asked=10, prompt_tokens=10, prompt_tokens_source="server",
                           output_tokens_asked=sum(tokens), output_tokens=sum(tokens),
                           output_tokens_source="server", chunks=len(chunks), error_kind=error)
    return record, chunks


def _frames(*items):
    return (m.with_request_metrics(requests_frame([r for r, _ in items])),
            chunks_frame([c for _, cs in items for c in cs]))


def test_request_metrics_follow_the_definitions():
    req, _ = _frames(_req(0, intended=100, sent=103, chunk_times=[150, 160, 190], tokens=[1, 1, 2]))
    row = req.row(0, named=True)
    assert row["queue_delay_ms"] == 3 and row["ttft_ms"] == 50 and row["ttft_service_ms"] == 47
    assert row["tpot_ms"] == pytest.approx((190 - 150) / 3) and row["e2e_ms"] == 91


def test_itl_is_per_token_and_chunk_gap_per_chunk():
    req, chunks = _frames(_req(0, 0, 0, [10, 20, 60], [1, 1, 4]))
    gaps = m.chunk_gaps(req, chunks)
    assert gaps["chunk_gap_ms"].to_list() == [10, 40]
    assert sorted(m.itl_samples(gaps).to_list()) == [10, 10, 10, 10, 10]


def test_warmup_and_failed_requests_are_excluded_from_latency():
    req, chunks = _frames(_req(0, 0, 0, [10, 20], [1, 1]), _req(1, 0, 0, [500, 900], [1, 1], warmup=True),
                          _req(2, 0, 0, [800], [1], error="protocol"))
    measured = m.measured(req)
    table = m.metric_table(measured, m.chunk_gaps(req, chunks).filter(~m.pl.col("warmup")))
    assert table["ttft_ms"]["count"] == 1 and table["ttft_ms"]["max"] == 10
    counts = m.request_counts(measured)
    assert (counts["completed"], counts["failed"], counts["error_rate"]) == (1, 1, 0.5)


def test_goodput_counts_requests_within_every_limit():
    req, _ = _frames(_req(0, 0, 0, [10, 20], [1, 1]), _req(1, 0, 0, [300, 310], [1, 1]),
                     _req(2, 0, 0, [10, 20], [1, 1], error="http_5xx"))
    assert m.is_good(req, ttft_ms=100, tpot_ms=None, e2e_ms=None).to_list() == [True, False, False]


@pytest.mark.parametrize("stat, needed", [("p50", 2), ("p90", 10), ("p99", 100), ("p999", 1000), ("max", 1),
                                          ("mean", 1)])
def test_min_samples_per_percentile(stat, needed):
    assert min_samples(stat) == needed


@pytest.mark.parametrize("objectives, lag, expected", [
    ([Objective("a", 1, 0.5, 100, True)], 0.1, "pass"),
    ([Objective("a", 1, 2.0, 100, False), Objective("b", 1, None, 3, None)], 0.1, "fail"),
    ([Objective("a", 1, 0.5, 100, True), Objective("b", 1, 0.5, 3, None)], 0.1, "inconclusive"),
    ([Objective("a", 1, 2.0, 100, False)], 50.0, "inconclusive"),  # the generator lagged: cannot judge
    ([], None, "pass"),
])
def test_verdict(objectives, lag, expected):
    assert verdict(objectives, lag, max_lag_ms=10)[0] == expected


def test_evaluate_marks_thin_percentiles_inconclusive():
    slo = Slo.model_validate({"ttft_ms": {"p50": 100, "p99": 100}, "error_rate": {"max": 0.1}})
    metrics = {k: {"count": 50, "p50": 40.0, "p99": 150.0} for k in ("ttft_ms",)}
    metrics.update({k: {"count": 0} for k in ("ttft_service_ms", "itl_ms", "chunk_gap_ms", "tpot_ms", "e2e_ms")})
    out = {o.objective: o.passed for o in evaluate(slo, metrics, {"completed": 50, "failed": 0, "error_rate": 0.0},
                                                    50, 50, 1.0)}
    assert out == {"ttft_ms.p50": True, "ttft_ms.p99": None, "error_rate.max": True}
