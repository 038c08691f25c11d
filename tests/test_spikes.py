"""Stall attribution on hand-made timelines (ms), and the pieces it is built from."""

from __future__ import annotations

import dataclasses
import random

import polars as pl
import pytest

from loadgen.analysis import metrics as m
from loadgen.analysis import prefill, spikes
from loadgen.analysis.slo_stalls import stall_objectives
from loadgen.core import ChunkRecord, RequestRecord
from loadgen.report import wording
from loadgen.plan.slo_spec import Slo
from loadgen.records.schema import chunks_frame, requests_frame

MS = 1_000_000
FIT = prefill.PrefillFit(0.0, 0.03, 0.0, 0)  # prefill = 0.03 ms per prompt token
CFG = spikes.SpikeConfig(spike_factor=4, min_gap_ms=0, long_prompt_tokens=5000, group_ms=5)


def _req(seq, prompt, sent, times, error=None):
    record = RequestRecord(seq=seq, class_name="a", warmup=False, t_intended_ns=sent * MS, t_sent_ns=sent * MS,
                           t_first_token_ns=int(times[0] * MS) if times else None,
                           t_last_token_ns=int(times[-1] * MS) if times else None,
                           t_done_ns=int((times[-1] if times else sent) * MS) + MS, prompt_tokens_asked=prompt,
                           prompt_tokens=prompt, prompt_tokens_source="server", output_tokens_asked=len(times),
                           output_tokens=len(times), output_tokens_source="server", chunks=len(times),
                           error_kind=error)
    return record, [ChunkRecord(seq, int(t * MS), 1) for t in times]


def _victim(seq, stall_from, stall_to, start=0, end=600):
    """Tokens every 10 ms from ``start``, none between ``stall_from`` and ``stall_to``."""
    return _req(seq, 100, start - 5, [t for t in range(start, end, 10) if not stall_from < t < stall_to])


def _analyse(*items, fit=FIT, cfg=CFG):
    req = m.with_request_metrics(requests_frame([r for r, _ in items]))
    chunks = chunks_frame([c for _, cs in items for c in cs])
    gaps = m.chunk_gaps(req, chunks)
    base = spikes.baselines(gaps.join(req.filter(pl.col("ok")).select("worker", "seq"), on=["worker", "seq"],
                                      how="semi"))
    stalls = spikes.find_stalls(gaps.join(req.filter(pl.col("ok")).select("worker", "seq"),
                                          on=["worker", "seq"], how="semi"), base, cfg)
    windows = prefill.prefill_windows(req, fit, cfg.long_prompt_tokens)
    return spikes.attribute(stalls, windows, req, cfg)


def _result(stalls):
    return sorted((r["seq"], r["prefill_induced"], tuple(r["culprits"] or ()), r["cause"])
                  for r in stalls.iter_rows(named=True))


CASES = {
    "one culprit, many victims": (
        [_victim(1, 100, 400), _victim(2, 100, 400), _victim(3, 100, 400),
         _req(9, 10000, 95, [400, 410])],  # 10000 tokens → 300 ms window [100, 400]
        [(1, True, (9,), "prefill"), (2, True, (9,), "prefill"), (3, True, (9,), "prefill")]),
    "several culprits in one step": (
        [_victim(1, 100, 400), _req(8, 6000, 90, [400]), _req(9, 9000, 95, [400, 405])],
        [(1, True, (9, 8), "prefill")]),
    "window touching the gap's start is no culprit": (
        [_victim(1, 400, 700, end=800), _req(9, 10000, 95, [400, 410])],
        [(1, False, (), "unknown")]),
    "window far from the gap's end, covering too little": (
        [_victim(1, 100, 400), _req(9, 6000, 40, [220, 230])],  # window [40, 220]: 120 of a 300 ms gap
        [(1, False, (), "unknown")]),
    "queueing without prefill": (
        [_victim(1, 100, 400), _req(9, 10000, 100, [800])],  # queued: its prefill window is [500, 800]
        [(1, False, (), "unknown")]),
    "a chunked prefill covering several gaps": (
        [_req(1, 100, 0, [0, 10, 20, 150, 280, 290]), _req(9, 10000, 15, [320])],  # window [20, 320]
        [(1, True, (9,), "prefill"), (1, True, (9,), "prefill")]),
    "short prompts never blame": (
        [_victim(1, 100, 400), _req(9, 200, 95, [400])],
        [(1, False, (), "unknown")]),
    "many prefills admitted at once": (
        [_victim(1, 100, 400)] + [_req(10 + i, 300, 95, [400]) for i in range(4)],
        [(1, False, (), "prefill_burst")]),
    "a request with no tokens and one with a single token": (
        [_victim(1, 100, 400), _req(9, 10000, 95, [], error="http_5xx"), _req(7, 10000, 95, [400])],
        [(1, True, (7,), "prefill")]),
}


@pytest.mark.parametrize("name", CASES)
def test_attribution(name):
    items, expected = CASES[name]
    assert _result(_analyse(*items)) == sorted(expected)


def test_one_engine_step_is_one_spike_event():
    stalls = _analyse(_victim(1, 100, 400), _victim(2, 100, 400), _victim(3, 200, 700, end=800),
                      _req(9, 10000, 95, [400]), _req(8, 16000, 390, [700]))
    events = spikes.group_events(stalls, group_ms=5)
    assert events.select("victims", "culprits").to_dicts() == [{"victims": 2, "culprits": [9]},
                                                               {"victims": 1, "culprits": [8]}]


def test_coalesced_chunks_are_not_stalls():
    record, _ = _req(1, 100, 0, list(range(0, 200, 10)))
    chunks = [ChunkRecord(1, t * MS, 1) for t in range(0, 100, 10)] + [ChunkRecord(1, 140 * MS, 4)]
    stalls = _analyse((record, chunks))
    assert stalls.is_empty()  # 40 ms for 4 tokens at a 10 ms baseline is on time


def test_prefill_fit_recovers_the_lower_envelope():
    rng = random.Random(1)
    rows = []
    for seq in range(400):
        p = rng.choice([rng.randint(50, 2000), rng.randint(8000, 16000)])
        truth = 8 + 0.0325 * p + 5e-6 * p * p
        queued = rng.random() < 0.6
        rows.append(_req(seq, p, 0, [truth + (rng.uniform(5, 500) if queued else rng.uniform(0, 1)), 2000]))
    fit = prefill.fit_prefill(m.with_request_metrics(requests_frame([r for r, _ in rows])))
    for p in (100, 1000, 8000, 16000):
        expected = 8 + 0.0325 * p + 5e-6 * p * p
        got = fit.a + fit.b * p + fit.c * p * p
        assert got == pytest.approx(expected, rel=0.1, abs=3), p


@pytest.mark.parametrize("times, target, expected", [
    ([0, 10, 20, 100, 110], 10, 0.75),   # one stall is one miss: the schedule restarts after it
    ([0, 5, 10, 15, 40], 10, 1.0),       # early tokens bank slack: 40 <= 0 + 4 × 10
    ([0, 30, 60], 10, 0.0),
])
def test_fluidity_index(times, target, expected):
    record, chunks = _req(1, 10, 0, times)
    req = m.with_request_metrics(requests_frame([record]))
    assert m.fluidity(req, chunks_frame(chunks), target)["index"] == pytest.approx(expected)


def test_stall_objectives():
    items = [_victim(s, 100, 400) for s in range(1, 4)] + [_req(9, 10000, 95, [400, 410])]
    req = m.with_request_metrics(requests_frame([r for r, _ in items]))
    gaps = m.chunk_gaps(req, chunks_frame([c for _, cs in items for c in cs]))
    slo = Slo.model_validate({"ttft_ms": {"base": 10, "per_prompt_token": 0.05, "max_violation_ratio": 0.5},
                              "itl_ms": {"max_per_request": 250},
                              "stalls": {"max_per_1k_tokens": 100, "max_prefill_induced_per_1k_tokens": 1}})
    out = {o.objective: (o.value, o.passed) for o in stall_objectives(
        slo, req, gaps, {"per_1k_tokens": 20.0, "prefill_induced_per_1k_tokens": 20.0})}
    assert out["ttft_ms.prompt_aware"] == (0.0, True)  # 5 ms for 100 tokens, 305 ms for 10000: within limits
    assert out["itl_ms.max_per_request"][1] is None     # 4 requests: too few for a p99 over requests
    assert out["stalls.max_per_1k_tokens"] == (20.0, None)  # too few tokens for a rate per 1k


def _evidence(*items, tol_ms=30.0):
    req = m.with_request_metrics(requests_frame([r for r, _ in items]))
    gaps = m.chunk_gaps(req, chunks_frame([c for _, cs in items for c in cs]))
    ok_gaps = gaps.join(req.filter(pl.col("ok")).select("worker", "seq"), on=["worker", "seq"], how="semi")
    stalls = spikes.find_stalls(ok_gaps, spikes.baselines(ok_gaps), CFG)
    longs = req.filter(pl.col("prompt_tokens") >= CFG.long_prompt_tokens)
    ev = prefill.prefill_evidence(req, prefill.stall_episodes(req, stalls, tol_ms, cuts=longs))
    return dict(zip(ev["seq"].to_list(), ev["ttft_service_ms"].to_list()))


def test_a_stream_that_had_just_resumed_does_not_collapse_the_evidence():
    """vLLM's CPU build, 2 runs an hour apart: one 2 ms gap of a stream that resumed as a long prompt got its
    first token used to lower that prompt's prefill to 2 ms, and the fit to 2.2 ms + 0 ms/token."""
    resumed = _req(5, 100, 0, [t for t in range(0, 100, 10)] + [399, 401] + list(range(410, 600, 10)))
    ev = _evidence(_victim(1, 100, 400), _victim(2, 100, 400), resumed, _req(9, 10000, 20, [400, 410]))
    assert ev[9] == pytest.approx(305, abs=10)  # the stall episode its prefill caused, not the 2 ms gap


def test_a_slice_that_ends_one_step_before_the_first_token_is_still_the_evidence():
    """llama.cpp: the victims resume after the long slice; the prompt's last small slice takes one more step."""
    ev = _evidence(_victim(1, 100, 400), _victim(2, 100, 400), _req(9, 10000, 20, [415, 425]))
    assert ev[9] == pytest.approx(300, abs=1)


def test_an_episode_that_began_before_the_send_lowers_nothing():
    ev = _evidence(_victim(1, 100, 400), _victim(2, 100, 400), _req(8, 10000, 20, [400]),
                   _req(9, 6000, 250, [600, 610]))  # sent mid-stall: queued behind request 8
    assert ev[9] == pytest.approx(350, abs=1)  # its TTFT: nothing shows its own prefill


def test_causes_are_physical_and_an_infinite_lift_is_said():
    assert "max_in_flight" not in spikes.CAUSES and "client_lag" in spikes.CAUSES
    assert wording.lift_words({"lift": None, "lift_infinite": True}) == "lift ×∞: no stall outside long prefills"
    assert wording.lift_words({"lift": 3.0, "lift_infinite": False}) == "lift ×3.0"


def test_a_send_the_client_made_late_names_the_client():
    victim, chunks = _victim(1, 100, 400)
    late, _ = _req(7, 100, 350, [])  # due at 150, sent at 350, the in-flight cap far from full
    late = dataclasses.replace(late, t_intended_ns=150 * MS, error_kind="http_5xx")
    stalls = _analyse((victim, chunks), (late, []), cfg=spikes.SpikeConfig(
        spike_factor=4, min_gap_ms=0, long_prompt_tokens=5000, group_ms=5, max_in_flight=10))
    assert _result(stalls) == [(1, False, (), "client_lag")]


def test_back_to_back_prefills_each_get_their_own_part_of_the_episode():
    """SGLang/TGI/vLLM: R's prefill step, then Q's; the victims' stalls merge into one episode. Q's evidence is
    cut at R's first token (the engine's work for Q began after R's prefill ended), not the whole episode."""
    victims = [_req(s, 100, 0, [t for t in range(0, 900, 10) if not (100 < t < 400 or 400 < t < 700)])
               for s in (1, 2)]
    ev = _evidence(*victims, _req(8, 10000, 20, [400, 900]), _req(9, 10000, 30, [700, 900]))
    assert ev[8] == pytest.approx(300, abs=1) and ev[9] == pytest.approx(300, abs=1)


def test_first_tokens_of_one_step_do_not_collapse_the_fit():
    """The real-time causes run, 2 in 6: after a block of loadgen's loop a 5000-token and a 200-token prompt went
    out together while nothing decoded, got their first tokens from one step (read 0.13 ms apart), then both
    paused for the next prefill. That pause began 0.13 ms before the long prompt's first token and was taken as
    its prefill: the monotone envelope then put every length at <= 0.13 ms (a = 0.11 ms, b ≈ 0)."""
    together = [_req(10, 100, 1000, [1302.87, 1371, 1381]), _req(11, 10000, 1000, [1303.0, 1371.1, 1381])]
    items = [_victim(1, 100, 400), _victim(2, 100, 400), _req(8, 10000, 20, [400, 410]), *together,
             _req(12, 2000, 1310, [1371.2, 1381])]
    ev = _evidence(*items)
    assert ev[11] == pytest.approx(303, abs=1)  # its TTFT: no pause of another stream covers its prefill
    assert ev[8] == pytest.approx(300, abs=1) and ev[12] == pytest.approx(61.2, abs=1)  # the real evidence stays
    req = m.with_request_metrics(requests_frame([r for r, _ in items]))
    gaps = m.chunk_gaps(req, chunks_frame([c for _, cs in items for c in cs]))
    stalls = spikes.find_stalls(gaps, spikes.baselines(gaps), CFG)
    fit = prefill.fit_prefill(req, prefill.stall_episodes(req, stalls, 30.0, cuts=req.filter(
        pl.col("prompt_tokens") >= CFG.long_prompt_tokens)))
    for tokens, truth_ms in ((10000, 300.0), (2000, 60.0)):  # the engine's 0.03 ms per prompt token
        assert fit.a + fit.b * tokens + fit.c * tokens**2 == pytest.approx(truth_ms, rel=0.1), (tokens, fit)
