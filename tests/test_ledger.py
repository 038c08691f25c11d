"""The SLO-miss ledger (analysis/ledger.py): each cause of the decision order on a hand-made timeline (ms) of
steady background streams plus the one request that misses, the summary's shape, and on a virtual-time replay of
scenarios/aggressor_victim.yaml (the simulator's long prefills stall the victims) that the misses are blamed on
prefill with culprits and little is left unexplained."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import polars as pl
import pytest

from loadgen.advise import replay_observe
from loadgen.analysis import ledger_evidence as ev
from loadgen.analysis import server_frames, spikes
from loadgen.analysis.ledger_evidence import loop_blocks
from loadgen.drivers import loop_sampler
from loadgen.analysis.ledger import MISS_SCHEMA, Ledger, miss_ledger
from loadgen.analysis.objective_samples import ObjectiveSamples
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen import api
from loadgen.analysis.summary import prefilled, summarize
from loadgen.core import ChunkRecord, RequestRecord
from loadgen.core.vocabulary import CAUSES, STALL_CAUSES
from loadgen.plan.slo_spec import Slo
from loadgen.records.schema import chunks_frame, requests_frame
from tests.virtual_truth import virtual_run

MS = 1_000_000
SLO = {"ttft_ms": {"p50": 300, "p99": 500}, "tpot_ms": {"p99": 30}, "itl_ms": {"p99": 100}, "e2e_ms": {"p99": 2500},
       "goodput": {"ttft_ms": 500}, "stalls": {"long_prompt_tokens": 5000}}
LATE = 3000  # the request under test is sent here, among the background streams
QUIET = 6000  # no stream starts after this (no prefill runs), a dozen still decode for a second
GAPPED = [QUIET + 20 + 10 * i for i in range(30)] + [QUIET + 900 + 10 * i for i in range(30)]  # a 600-ms gap


def _req(seq: int, sent: float, times: Sequence[float], prompt: int = 200, intended: float | None = None,
         error: str | None = None, status: int | None = None, message: str | None = None
         ) -> tuple[RequestRecord, list[ChunkRecord]]:
    record = RequestRecord(seq=seq, class_name="a", warmup=False, t_intended_ns=int((intended or sent) * MS),
                           t_sent_ns=int(sent * MS), t_first_token_ns=int(times[0] * MS) if times else None,
                           t_last_token_ns=int(times[-1] * MS) if times else None,
                           t_done_ns=int(((times[-1] if times else sent) + 1) * MS), prompt_tokens_asked=prompt,
                           prompt_tokens=prompt, prompt_tokens_source="server", output_tokens_asked=len(times),
                           output_tokens=len(times), output_tokens_source="server", chunks=len(times),
                           http_status=status or 200, error_kind=error, error_message=message)
    return record, [ChunkRecord(seq, int(t * MS), 1) for t in times]


def _background() -> list[tuple[RequestRecord, list[ChunkRecord]]]:
    """Streams sent every 100 ms for 6 s, prompts 100..1000 tokens prefilled at 0.1 ms a token, then 200
    tokens 10 ms apart: a prefill fit of ≈0.1 ms a token, a 10-ms baseline ITL, twenty streams decoding at once
    (after ``QUIET``: no new stream, the last ones still decoding)."""
    out = []
    for k in range(60):
        sent, prompt = 100.0 * k, 100 * (k % 10 + 1)
        first = sent + prompt / 10
        out.append(_req(1000 + k, sent, [first + 10 * i for i in range(200)], prompt))
    return out


def _steady(seq: int, sent: float, ttft: float, tokens: int = 20, step: float = 10.0,
            **kw: Any) -> tuple[RequestRecord, list[ChunkRecord]]:
    return _req(seq, sent, [sent + ttft + step * i for i in range(tokens)], **kw)


def _ledger(*items: tuple[RequestRecord, list[ChunkRecord]], server: pl.DataFrame | None = None,
            client: pl.DataFrame | None = None, slo: dict[str, Any] | None = None,
            columns: dict[str, list[Any]] | None = None, cap: int | None = None) -> Ledger:
    every = _background() + list(items)
    requests = requests_frame([r for r, _ in every])
    for name, values in (columns or {}).items():  # later record columns: the background's connections reused,
        # its headers 1 ms after the send
        given = pl.Series(name, [None] * (len(every) - len(values)) + values, pl.Int64)
        usual = pl.col("t_sent_ns") + MS if name == "t_headers_ns" else pl.lit(0)
        requests = requests.with_columns(given.alias(name)).with_columns(pl.col(name).fill_null(usual))
    chunks = chunks_frame([c for _, cs in every for c in cs])
    run = RunAnalysis(requests, chunks, "declared")
    spec = Slo.model_validate(slo or SLO)
    spike = spikes.analyze(prefilled(run.req), prefilled(run.measured), run, spikes.config_from(spec, cap),
                           server_frames.preemption_windows(server))
    return miss_ledger(run, spec, spike, server, client, cap)


def _row(ledger: Ledger, seq: int) -> dict[str, Any]:
    rows = ledger.misses.filter(pl.col("seq") == seq)
    assert rows.height == 1, ledger.misses.select("seq", "metric", "cause", "evidence")
    return rows.row(0, named=True)


def test_the_background_alone_misses_nothing_and_the_frame_keeps_its_schema() -> None:
    ledger = _ledger(_steady(1, LATE, 40))  # a request that met everything is absent
    assert ledger.misses.is_empty() and ledger.misses.schema == MISS_SCHEMA
    assert ledger.summary == {"requests": 0, "of": 61, "share": 0.0, "limits": {"ttft_ms": 500.0, "e2e_ms": 2500.0,
                              "tpot_ms": 30.0, "itl_ms": 100.0}, "by_cause": {}, "unexplained_share": 0.0, "top": []}


def test_a_request_that_waited_beyond_its_own_prefill_was_queued() -> None:
    row = _row(_ledger(_steady(1, LATE, 1500)), 1)
    assert (row["metric"], row["cause"], row["missed"]) == ("ttft_ms", "queueing", ["ttft_ms"])
    assert row["value_ms"] == pytest.approx(1500) and row["excess_ms"] == pytest.approx(1000)
    assert row["wait_ms"] == pytest.approx(1500 - row["own_ms"]) and row["own_ms"] < 60
    assert f"waited {row['wait_ms']:,.0f} ms beyond its own" in row["evidence"] and "excess 1,000 ms" in row["evidence"]
    assert not row["good"]


def test_a_wait_while_the_servers_kv_cache_was_full_is_preemption() -> None:
    scrapes = pl.DataFrame({"t_ns": [k * 1000 * MS for k in range(8)], "name": ["kv_cache_usage"] * 8,
                            "value": [0.5, 0.5, 0.6, 0.97, 0.99, 0.7, 0.5, 0.5]})
    row = _row(_ledger(_steady(1, LATE, 1500), server=scrapes), 1)
    assert row["cause"] == "preemption" and "KV cache was 99% full" in row["evidence"]
    calm = scrapes.with_columns(value=pl.lit(0.5))
    assert _row(_ledger(_steady(1, LATE, 1500), server=calm), 1)["cause"] == "queueing"


def test_a_prompt_whose_own_prefill_is_over_the_limit_is_its_own() -> None:
    row = _row(_ledger(_steady(1, LATE, 820, prompt=8000)), 1)
    assert row["cause"] == "own_prompt" and row["own_ms"] >= 500
    assert "8,000 tokens" in row["evidence"]


def test_a_request_loadgen_sent_late_is_the_clients() -> None:
    row = _row(_ledger(_steady(1, LATE + 1200, 20, intended=LATE)), 1)
    assert row["cause"] == "client_lag" and row["send_lag_ms"] == pytest.approx(1200)
    assert "sent it 1,200 ms late" in row["evidence"]


def test_a_send_the_in_flight_cap_held_waited_for_the_server() -> None:
    """About 20 background streams are in flight at ``LATE``: with max_in_flight 20 the send due then waited for
    a slot the server freed (a wait: queueing, named as the cap's); with a cap never full it is loadgen's."""
    late = _steady(1, LATE + 1200, 20, intended=LATE)
    row = _row(_ledger(late, cap=20), 1)
    assert row["cause"] == "queueing" and row["send_lag_ms"] < 100 and row["wait_ms"] > 1100
    assert "held by max_in_flight (2" in row["evidence"] and "in flight)" in row["evidence"]
    free = _row(_ledger(late, cap=100), 1)
    assert free["cause"] == "client_lag" and free["send_lag_ms"] == pytest.approx(1200)


def _lags(lags: dict[float, float], span_s: int = 20) -> pl.DataFrame:
    """loop_lag_ms rows as loadgen's sampler stores them: a 0.5-ms heartbeat each second, plus ``lags`` (ms
    from the start → the lag in ms)."""
    rows = {1000.0 * k + 3: 0.5 for k in range(span_s)} | lags
    return pl.DataFrame({"t_ns": [int(t * MS) for t in sorted(rows)], "name": ["loop_lag_ms"] * len(rows),
                         "value": [rows[t] for t in sorted(rows)]})


def test_loop_blocks_merge_one_backlog_only_never_across_the_samplers_heartbeat() -> None:
    """The sampler stores lags under 2 ms once a second: two 6-ms lags 0.9 s apart are two small blocks, not
    one of 906 ms; a 600-ms block and the backlog firings right after it (each due 50 ms after the previous
    fired) stay one block of about 600 ms."""
    two = loop_blocks(_lags({10_300.0: 6.0, 11_200.0: 6.0}))
    assert ((two["b1_ns"] - two["b0_ns"]) / MS).to_list() == [6.0, 6.0]
    one = loop_blocks(_lags({5_600.0: 600.0, 5_660.0: 10.0, 5_714.0: 4.0}))
    assert one.height == 1 and (one["b1_ns"] - one["b0_ns"]).item() / MS == pytest.approx(660)
    assert ev.SAMPLER_PERIOD_MS * MS == loop_sampler.PERIOD_NS == replay_observe.LOOP_TICK_NS
    assert ev.SAMPLER_GRAIN_MS == loop_sampler.KEEP_LAG_MS == replay_observe.KEEP_LAG_MS


def test_the_replays_loop_lag_rows_are_stored_as_the_sampler_stores_them() -> None:
    """A 300-ms hog shows as one late firing; the rest are 0-lag heartbeats about a second apart, as
    loop_sampler.py keeps them (not a row every 50 ms)."""
    hog = replay_observe.ReplayFaults(hogs_ns=((3_010 * MS, 3_310 * MS),))
    rows = replay_observe.client_rows(hog, 10_000 * MS, 0)
    lag = [(t, v) for t, name, v in rows if name == "loop_lag_ms"]
    assert [v for _, v in lag if v > 0] == [pytest.approx(290, abs=50)]
    assert sum(v == 0 for _, v in lag) == 9  # a heartbeat a second after the last row kept, the hog's too
    assert all(1000 * MS <= b - a <= 1050 * MS for (a, _), (b, v) in zip(lag, lag[1:]) if v < 2)
    assert sum(name == "cpu_busy_share" for _, name, _ in rows) == 9  # once a second (the hog's end moved it)


def test_a_loop_blocked_while_it_should_have_read_is_the_clients() -> None:
    written = [LATE + 100 + 10 * i for i in range(120)]  # the server wrote its tokens on time ...
    read = [max(w, LATE + 1001 + 0.01 * i) for i, w in enumerate(written)]  # ... read at once as the loop woke
    lag = pl.DataFrame({"t_ns": [int((LATE + t) * MS) for t in (300, 1001, 1500)], "name": ["loop_lag_ms"] * 3,
                        "value": [2.0, 950.0, 1.0]})  # blocked over [LATE + 51, LATE + 1001]
    row = _row(_ledger(_req(1, LATE, read), client=lag), 1)
    assert row["cause"] == "client_lag" and row["read_lag_ms"] == pytest.approx(950)  # the block since the send
    assert "loadgen's loop was blocked 950 ms before the first token" in row["evidence"]
    late = _steady(1, LATE, 1000)  # read alone, its next token a step later: written as the block ended
    assert _row(_ledger(late, client=lag), 1)["cause"] == "queueing"
    over = lag.with_columns(pl.col("t_ns") - 300 * MS)  # a block over before the server wrote
    assert _row(_ledger(late, client=over), 1)["cause"] == "queueing"
    without = _row(_ledger(late), 1)  # no client metrics: a wait
    assert without["cause"] == "queueing" and without["read_lag_ms"] == 0.0


def test_a_backlog_worked_off_after_a_block_is_still_the_clients() -> None:
    """A timer due every 50 ms: late by 950 ms, then twice more as the loop works off its backlog; the read at
    1,120 ms (over 25 ms after the long block ended) waited for the whole of it."""
    fired = [LATE + 50 * k for k in range(-20, 2)] + [LATE + 1001, LATE + 1071, LATE + 1131]
    fired += [LATE + 1181 + 50 * k for k in range(20)]
    lag = pl.DataFrame({"t_ns": [int(t * MS) for t in sorted(fired)], "name": ["loop_lag_ms"] * len(fired),
                        "value": [{LATE + 1001: 950.0, LATE + 1071: 20.0, LATE + 1131: 10.0}.get(t, 0.5)
                                  for t in sorted(fired)]})
    written = [LATE + 100 + 10 * i for i in range(120)]
    read = [max(w, LATE + 1120 + 0.01 * i) for i, w in enumerate(written)]
    row = _row(_ledger(_req(1, LATE, read), client=lag), 1)
    assert row["cause"] == "client_lag" and row["read_lag_ms"] > 900


@pytest.mark.parametrize("column, value, sent", [("connect_ns", 900 * MS, LATE + 900),
                                                  ("t_headers_ns", (LATE + 901) * MS, LATE)],
                         ids=["connect and TLS (before the send)", "headers late"])
def test_transport_time_is_the_networks(column: str, value: int, sent: float) -> None:
    row = _row(_ledger(_req(1, sent, [LATE + 1000 + 10 * i for i in range(20)], intended=LATE),
                       columns={column: [value]}), 1)
    assert row["cause"] == "network" and row["network_ms"] == pytest.approx(900)
    assert row["send_lag_ms"] == pytest.approx(0.0)  # a send the connect made late is not the client's


def test_a_gap_of_one_stream_alone_while_the_server_preempted_is_preemption() -> None:
    scrapes = pl.DataFrame({"t_ns": [k * 1000 * MS for k in range(9)], "name": ["preemptions_total"] * 9,
                            "value": [0.0, 0, 0, 0, 0, 0, 0, 1, 1]})  # rose over [6000, 7000] ms
    row = _row(_ledger(_req(1, QUIET, GAPPED), server=scrapes), 1)
    assert (row["metric"], row["cause"]) == ("itl_ms", "preemption")
    assert "alone" in row["evidence"] and "preemption counter rose" in row["evidence"]
    assert row["good"]  # the goodput limits judge TTFT only


def test_a_gap_covered_by_another_requests_long_prefill_names_that_culprit() -> None:
    victim = _req(1, QUIET, GAPPED)
    culprit = _req(7, QUIET + 300, [QUIET + 900, QUIET + 910], prompt=9000)  # its prefill ends with the gap
    ledger = _ledger(victim, culprit)
    row = _row(ledger, 1)
    assert (row["metric"], row["cause"], row["culprits"]) == ("itl_ms", "prefill", [7])
    assert "seq 7 (9,000 tokens)" in row["evidence"]
    assert _row(ledger, 7)["cause"] in ("own_prompt", "queueing")  # its own TTFT: not a culprit of itself


def test_a_gap_shared_with_no_culprit_is_load_one_with_new_streams_a_burst_and_one_of_its_own_unknown() -> None:
    ledger = _ledger(*(_req(seq, QUIET, GAPPED) for seq in range(1, 16)))
    row = _row(ledger, 1)
    assert (row["metric"], row["cause"]) == ("itl_ms", "load")
    assert "of the" in row["evidence"] and "other streams decoding paused with it" in row["evidence"]
    among = _row(_ledger(_req(1, LATE, [t - QUIET + LATE for t in GAPPED])), 1)  # streams started in it
    assert among["cause"] == "prefill_burst" and "other requests got their first token in it" in among["evidence"]
    alone = _row(_ledger(_req(1, QUIET, GAPPED)), 1)
    assert alone["cause"] == "unknown" and "coincides with nothing" in alone["evidence"]


def test_long_prompts_prefilled_together_are_the_culprits_of_a_gap_none_covers_alone() -> None:
    """Two 5,000-token prompts (≈500 ms of prefill each: the fit, from a lone one that took 500 ms) prefilled in
    one engine step: the victim's 1,500-ms gap ends with both first tokens; each window covers a third of it."""
    gapped = [QUIET + 20 + 10 * i for i in range(30)] + [QUIET + 1810 + 10 * i for i in range(30)]
    lone = _req(8, 500, [1000, 1010], prompt=5000)
    a, b = (_req(seq, QUIET + 1200, [QUIET + 1810, QUIET + 1820], prompt=5000) for seq in (6, 7))
    row = _row(_ledger(_req(1, QUIET, gapped), lone, a, b), 1)
    assert (row["cause"], sorted(row["culprits"])) == ("prefill", [6, 7])
    assert "seq 6 (5,000 tokens)" in row["evidence"] and "seq 7 (5,000 tokens)" in row["evidence"]


def test_every_step_slow_without_a_stall_is_load() -> None:
    row = _row(_ledger(_steady(1, LATE, 20, tokens=20, step=40.0)), 1)
    assert (row["metric"], row["cause"]) == ("tpot_ms", "load")
    assert "median ITL 40.0 ms" in row["evidence"]


@pytest.mark.parametrize("tokens, step, cause", [(300, 10.0, "own_prompt"), (150, 20.0, "load")],
                         ids=["its own decode at the usual pace", "every step slower than usual"])
def test_an_end_to_end_miss_is_its_own_length_or_the_load(tokens: int, step: float, cause: str) -> None:
    row = _row(_ledger(_steady(1, LATE, 20, tokens=tokens, step=step)), 1)
    assert (row["metric"], row["cause"], row["missed"]) == ("e2e_ms", cause, ["e2e_ms"])
    if cause == "own_prompt":
        assert row["own_ms"] == pytest.approx(20 + 299 * 10, abs=5) and "300 tokens" in row["evidence"]
    else:
        assert "beyond its tokens at the run's usual pace" in row["evidence"]


def test_an_error_is_always_decisive_a_connect_error_the_networks() -> None:
    ledger = _ledger(_req(1, LATE, [], error="http_5xx", status=500, message="engine died"),
                     _req(2, LATE, [], error="connect", status=0, message="connection refused"),
                     _req(3, LATE, [], error="cancelled", status=0))  # cut at the run's end: not a miss
    assert (_row(ledger, 1)["cause"], _row(ledger, 1)["metric"], _row(ledger, 1)["value_ms"]) == (
        "server_error", "error", None)
    assert "HTTP 500" in _row(ledger, 1)["evidence"] and "engine died" in _row(ledger, 1)["evidence"]
    assert _row(ledger, 2)["cause"] == "network" and _row(ledger, 2)["missed"] == ["error"]
    bug = _row(_ledger(_req(4, LATE, [], error="internal", status=0, message="KeyError")), 4)
    assert bug["cause"] == "unknown" and "loadgen's own failure (error_kind internal" in bug["evidence"]
    assert 3 not in ledger.misses["seq"].to_list()


def test_the_summary_counts_requests_and_goodput_lost_per_cause() -> None:
    ledger = _ledger(_steady(1, LATE, 1500), _steady(2, LATE + 50, 1600), _req(3, QUIET, GAPPED),
                     _req(4, LATE, [], error="http_5xx", status=500))
    s = ledger.summary
    assert (s["requests"], s["of"]) == (4, 64) and s["share"] == pytest.approx(4 / 64)
    assert list(s["by_cause"]) == ["queueing", "server_error", "unknown"] and s["top"] == list(s["by_cause"])
    queued = s["by_cause"]["queueing"]
    assert (queued["requests"], queued["share"], queued["goodput_lost"]) == (2, 0.5, 2)
    assert queued["goodput_lost_per_s"] == pytest.approx(2 / ledger.window_s)
    assert s["by_cause"]["unknown"]["goodput_lost"] == 0  # a gap miss is good by TTFT-only goodput limits
    assert s["unexplained_share"] == pytest.approx(0.25)
    assert ledger.of_class("a", 64) == s
    assert set(s["by_cause"]) <= set(CAUSES)


def test_without_the_stall_analysis_what_needs_it_is_unexplained_and_the_rest_decided() -> None:
    every = _background() + [_steady(1, LATE, 1500), _req(2, QUIET, GAPPED)]
    run = RunAnalysis(requests_frame([r for r, _ in every]), chunks_frame([c for _, cs in every for c in cs]),
                      "declared")
    ledger = miss_ledger(run, Slo.model_validate(SLO))
    assert (_row(ledger, 1)["cause"], _row(ledger, 2)["cause"]) == ("queueing", "unknown")


def test_the_causes_are_one_registry_in_decision_order() -> None:
    assert list(CAUSES)[:2] == ["server_error", "network"] and list(CAUSES)[-1] == "unknown"
    assert all(STALL_CAUSES[c] == CAUSES[c] for c in STALL_CAUSES)


def test_on_a_replay_of_long_prefills_the_misses_are_prefill_with_their_culprits() -> None:
    path = "scenarios/aggressor_victim.yaml"
    run = virtual_run(path, [])
    summary, tables = summarize(api.load_scenario(path, []), run.requests, run.chunks, None)
    misses, rows = summary["misses"], tables["misses"]
    assert misses["requests"] == rows.height >= 20 and misses["limits"] == {"itl_ms": 100.0}
    assert misses["top"][0] == "prefill" and misses["by_cause"]["prefill"]["share"] >= 0.9
    assert misses["unexplained_share"] <= 0.05
    longs = set(run.requests.filter(pl.col("prompt_tokens") >= 4000)["seq"].to_list())
    prefill = rows.filter(pl.col("cause") == "prefill")
    assert all(c and set(c) <= longs for c in prefill["culprits"].to_list())  # each names long prompts
    assert sum(summary["classes"][c]["misses"]["requests"] for c in summary["classes"]) == misses["requests"]


def _reasoned(seq: int, sent: float, tokens: int, thought: int, answer_at: float | None, finish: str | None = None,
              **kw: Any) -> tuple[RequestRecord, list[ChunkRecord]]:
    record, chunks = _steady(seq, sent, 20, tokens=tokens, **kw)
    first = None if answer_at is None else int((sent + answer_at) * MS)
    return replace(record, reasoning_tokens=thought, t_first_answer_ns=first, finish_reason=finish), chunks


def test_a_request_that_reasoned_and_never_answered_misses_ttft_answer_as_its_objective_counts() -> None:
    """No answer token is a miss of ttft_answer_ms whatever the limit (objective_samples.py): the ledger counts
    the requests its objective does; max_tokens spent reasoning is the request's own budget (own_prompt), any
    other end is unexplained, an error stays the error's."""
    slo = SLO | {"ttft_answer_ms": {"p99": 1000}}
    items = [_reasoned(1, LATE, 200, 100, 1500), _reasoned(2, LATE + 10, 20, 20, None, "length"),
             _reasoned(3, LATE + 20, 10, 10, None, "stop"), _reasoned(4, LATE + 30, 200, 40, 500),
             _reasoned(5, LATE + 40, 0, 5, None, error="http_5xx", status=500)]
    ledger = _ledger(*items, slo=slo)
    every = _background() + items
    run = RunAnalysis(requests_frame([r for r, _ in every]), chunks_frame([c for _, cs in every for c in cs]),
                      "declared")
    samples = ObjectiveSamples(run.measured.filter(pl.col("ok")), run, 0.95)
    objective = int((samples.values("ttft_answer_ms") > 1000).sum())
    judged = ledger.misses.filter(pl.col("missed").list.contains("ttft_answer_ms"))
    assert judged.height == objective == 3 and samples.misses("ttft_answer_ms") == 2
    spent, ended = _row(ledger, 2), _row(ledger, 3)
    assert (spent["metric"], spent["value_ms"], spent["limit_ms"], spent["cause"]) == (
        "ttft_answer_ms", None, 1000.0, "own_prompt")
    assert "no answer token: it reasoned 20 of its 20 output tokens (finish_reason length)" in spent["evidence"]
    assert ended["cause"] == "unknown" and "(finish_reason stop)" in ended["evidence"]
    assert _row(ledger, 1)["metric"] == "ttft_answer_ms" and _row(ledger, 1)["value_ms"] == pytest.approx(1500)
    assert _row(ledger, 5)["cause"] == "server_error" and 4 not in ledger.misses["seq"].to_list()
    assert _ledger(*items).misses.filter(pl.col("missed").list.contains("ttft_answer_ms")).is_empty()  # no limit


def _busy(client: pl.DataFrame, shares: dict[float, float], span_s: int = 20) -> pl.DataFrame:
    """``client`` with loadgen's CPU busy share once a second (ms from the start → share; 0.2 otherwise), each
    over the second before it, as loop_sampler.py stores it."""
    rows = {1000.0 * k + 3: 0.2 for k in range(1, span_s)} | shares
    cpu = pl.DataFrame({"t_ns": [int(t * MS) for t in sorted(rows)], "name": ["cpu_busy_share"] * len(rows),
                        "value": [rows[t] for t in sorted(rows)]})
    return pl.concat([client, cpu]).sort("t_ns")


def test_loadgens_cpu_busy_share_is_named_in_client_lag_evidence_and_decides_nothing_alone() -> None:
    """A block over a saturated second reads "CPU saturated" in its client_lag evidence, over a second not
    saturated the share at most; a gap nothing explains over a saturated second stays unknown (saturation
    without loop lag adds no time loadgen lost), named so; requests elsewhere carry no CPU words."""
    written = [LATE + 100 + 10 * i for i in range(120)]
    read = [max(w, LATE + 1001 + 0.01 * i) for i, w in enumerate(written)]
    lag = _lags({LATE + 1001: 950.0})  # blocked over [LATE + 51, LATE + 1001]
    saturated = _busy(lag, {LATE + 1003: 0.99})
    row = _row(_ledger(_req(1, LATE, read), client=saturated), 1)
    assert row["cause"] == "client_lag" and "CPU saturated (loadgen's process busy 99% ≥ 95%" in row["evidence"]
    calm = _row(_ledger(_req(1, LATE, read), client=_busy(lag, {})), 1)
    assert calm["cause"] == "client_lag" and "loadgen's process busy 20% of a CPU at most" in calm["evidence"]
    gap = _row(_ledger(_req(3, QUIET, GAPPED), client=_busy(_lags({}), {QUIET + 603: 1.0})), 3)
    assert gap["cause"] == "unknown" and "saturated (100%)" in gap["evidence"]
    assert "not called client_lag" in gap["evidence"]
    queued = _row(_ledger(_steady(2, LATE, 1500), client=saturated), 2)
    assert queued["cause"] == "queueing" and "CPU" not in queued["evidence"]
    windows = ev.cpu_windows(saturated)
    assert windows["c0_ns"][0] == windows["c1_ns"][0] - 1000 * MS and ev.CPU_PERIOD_MS * MS == loop_sampler.HEARTBEAT_NS
    assert (windows["c0_ns"][1:] == windows["c1_ns"][:-1]).all()  # each over the time since the previous one
