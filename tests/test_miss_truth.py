"""The SLO-miss ledger scored against the simulator's ground truth, per cause and per engine, in virtual time:
each cause injected on purpose into a short scenario (tests/data/causes_*.yaml; loadgen's loop blocked by the
replay's hogs for client_lag), replayed through each scheduler with the observations a real run has (server
scrapes, loop lag, response headers: tests/virtual_truth.py), the ledger's cause of every miss compared with
the true cause the trace gives (local_target/sim/truth_causes.py, the ledger's decision order on the engine's
exact facts). A replay is well under a second to a few seconds; each case is replayed once per session.

Preemption on llama.cpp and TGI is queueing, on both sides: neither engine preempts (the simulator keeps that:
``EngineConfig.reserves_kv``, engine.py: a request's whole context is held from its admission), so the same small
KV cache that makes vLLM and SGLang preempt makes their queue wait instead, and their /metrics, like the real
engines', carry neither KV usage nor a preemption counter. The trace says which engine ran (its ``engine`` line),
and the truth calls such a wait queueing.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any

import polars as pl
import pytest

from local_target.sim.truth_causes import true_causes, true_misses
from loadgen import api
from tests.virtual_truth import VirtualRun, records_by_id, virtual_run

ENGINES = {
    "vllm": [],
    "sglang": ["target.simulator.engine=sglang"],
    "llamacpp": ["target.simulator.engine=llamacpp", "target.simulator.max_num_batched_tokens=2048"],
    "tgi": ["target.simulator.engine=tgi"],
}
S_NS = 1_000_000_000
HOGS_NS = tuple((int((3 + 1.5 * k) * S_NS), int((3 + 1.5 * k) * S_NS) + 300_000_000) for k in range(17))
CAUSES = ("queueing", "preemption", "own_prompt", "prefill", "server_error", "network", "client_lag", "load")
RESERVES_KV = {"llamacpp", "tgi"}  # never preempt: a full KV cache is their admission queue (see above)
MIN_MISSES = 20
BAR = 0.9
MAX_UNEXPLAINED = 0.05


@dataclass
class CaseScore:
    truth: int  # misses whose true cause is the injected one
    predicted: int  # misses the ledger blamed on it
    hits: int
    misses: int  # all misses of the case (the ledger's and the truth's)
    agree: int  # misses where the ledger and the truth name the same cause
    unexplained: int  # ledger misses with cause unknown
    ledger_misses: int
    pairs: Counter[tuple[str, str]]  # (true cause, ledger cause) → requests ("-": not a miss on that side)

    @property
    def precision(self) -> float:
        return self.hits / self.predicted if self.predicted else 1.0

    @property
    def recall(self) -> float:
        return self.hits / self.truth if self.truth else 1.0

    @property
    def unexplained_share(self) -> float:
        return self.unexplained / self.ledger_misses if self.ledger_misses else 0.0


def scored(engine: str, cause: str) -> str:
    """The true cause the injected fault gives on ``engine``: KV pressure queues where KV is reserved."""
    return "queueing" if cause == "preemption" and engine in RESERVES_KV else cause


@functools.cache
def case_run(engine: str, cause: str, extra: tuple[str, ...] = ()) -> VirtualRun:
    return virtual_run(f"tests/data/causes_{cause}.yaml", ENGINES[engine] + list(extra),
                       HOGS_NS if cause == "client_lag" else ())


def truth_of(v: VirtualRun, path: str, overrides: list[str],
             trace: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """The true cause of each miss of ``v`` (from ``trace``, default its own), the scenario's in-flight cap
    weighed with every send's flight."""
    stalls, cap = v.summary["stalls"], api.load_scenario(path, overrides).load.max_in_flight
    flights = v.requests.select("t_sent_ns", "t_done_ns").drop_nulls().rows()
    return {rid: m.cause for rid, m in true_misses(v.trace if trace is None else trace, records_by_id(v),
                                                     v.limits_ms, list(v.hogs_ns),
                                                     stalls["long_prompt_tokens"], stalls["min_gap_ms"],
                                                     v.prefill_ms, cap, flights).items()}


@functools.cache
def case(engine: str, cause: str, extra: tuple[str, ...] = ()) -> CaseScore:
    v = case_run(engine, cause, extra)
    truth = truth_of(v, f"tests/data/causes_{cause}.yaml", ENGINES[engine] + list(extra))
    ledger = {f"{w}-{s}": c for w, s, c in v.tables["misses"].select("worker", "seq", "cause").iter_rows()}
    pairs = Counter((truth.get(rid, "-"), ledger.get(rid, "-")) for rid in set(truth) | set(ledger))
    cause = scored(engine, cause)
    return CaseScore(truth=sum(n for (t, _), n in pairs.items() if t == cause),
                     predicted=sum(n for (_, p), n in pairs.items() if p == cause),
                     hits=pairs[(cause, cause)], misses=sum(pairs.values()),
                     agree=sum(n for (t, p), n in pairs.items() if t == p),
                     unexplained=sum(n for (_, p), n in pairs.items() if p == "unknown"),
                     ledger_misses=len(ledger), pairs=pairs)


@pytest.mark.parametrize(("engine", "cause"), [(e, c) for c in CAUSES for e in ENGINES])
def test_the_ledger_names_the_injected_cause(engine: str, cause: str) -> None:
    sc = case(engine, cause)  # scored on scored(engine, cause): preemption is queueing on llama.cpp and TGI
    print(f"{engine:9s} {cause:12s} as {scored(engine, cause):10s} truth {sc.truth:4d} "
          f"precision {sc.precision:.3f} recall {sc.recall:.3f} "
          f"agree {sc.agree}/{sc.misses} unexplained {sc.unexplained_share:.3f}  {dict(sc.pairs)}")
    assert sc.truth >= MIN_MISSES, sc.pairs  # the fault really made misses of its cause
    assert sc.precision >= BAR and sc.recall >= BAR, sc.pairs
    assert sc.agree >= BAR * sc.misses, sc.pairs  # the other misses of the run are named right too
    assert sc.unexplained_share <= MAX_UNEXPLAINED, sc.pairs


@pytest.mark.parametrize("engine", sorted(RESERVES_KV))
def test_llamacpp_and_tgi_queue_on_a_full_kv_cache_instead_of_preempting(engine: str) -> None:
    """The KV-pressure case on an engine that reserves a request's context at admission: nothing is preempted,
    the cache is as full as on vLLM, and the misses it causes are waits on it, queueing in truth and ledger. Read
    as if the engine preempted (the trace without its engine line), the same waits are KV-bound: preemption."""
    v = case_run(engine, "preemption")
    steps = [e for e in v.trace if e["type"] == "step"]
    assert v.trace[0] == {"type": "engine", "engine": engine, "reserves_kv": True}
    assert not any(e["preempted"] for e in steps) and max(e["kv_usage"] for e in steps) >= 0.95
    sc = case(engine, "preemption")
    assert sc.truth >= MIN_MISSES and sc.precision >= BAR and sc.recall >= BAR, sc.pairs
    path, overrides = "tests/data/causes_preemption.yaml", ENGINES[engine]
    as_if = truth_of(v, path, overrides, [e for e in v.trace if e["type"] != "engine"])
    kv_bound = sum(c == "preemption" for c in as_if.values())
    print(f"{engine}: {sc.truth} queueing misses, {kv_bound} of them waited on a full KV cache")
    assert kv_bound >= BAR * sc.truth


def test_a_send_the_in_flight_cap_held_is_queueing_not_the_clients_lag() -> None:
    """Arrivals above capacity with a small in-flight cap (load.max_in_flight 24): the sends wait for a slot the
    server's slowness keeps full. That wait is queueing on both sides, not loadgen's lag, and says so."""
    sc = case("vllm", "queueing", ("load.max_in_flight=24",))
    print(f"cap 24: truth {sc.truth} precision {sc.precision:.3f} recall {sc.recall:.3f} {dict(sc.pairs)}")
    assert sc.truth >= MIN_MISSES and sc.precision >= BAR and sc.recall >= BAR, sc.pairs
    misses = case_run("vllm", "queueing", ("load.max_in_flight=24",)).tables["misses"]
    assert misses["evidence"].str.contains(r"held by max_in_flight \(2[0-4] in flight\)").sum() >= BAR * sc.truth


MIXED_HOGS_NS = tuple((int((5 + 4 * k) * S_NS), int((5 + 4 * k) * S_NS) + 300_000_000) for k in range(9))


@pytest.mark.parametrize("engine", ENGINES)
def test_causes_that_meet_in_one_run_are_told_apart(engine: str) -> None:
    """Every fault at once (tests/data/causes_mixed.yaml): the same requests missed on both sides, nine in ten
    named as the trace names them, and each cause the run has ten of at precision and recall >= 0.9."""
    v = virtual_run("tests/data/causes_mixed.yaml", ENGINES[engine], MIXED_HOGS_NS)
    truth = truth_of(v, "tests/data/causes_mixed.yaml", ENGINES[engine])
    ledger = {f"{w}-{s}": c for w, s, c in v.tables["misses"].select("worker", "seq", "cause").iter_rows()}
    pairs = Counter((truth.get(rid, "-"), ledger.get(rid, "-")) for rid in set(truth) | set(ledger))
    print(f"{engine} mixed: {sorted(pairs.items(), key=lambda kv: -kv[1])}")
    assert len(truth) >= 100 and truth.keys() == ledger.keys()
    assert sum(n for (t, p), n in pairs.items() if t == p) >= BAR * len(truth), pairs
    assert sum(c == "unknown" for c in ledger.values()) <= MAX_UNEXPLAINED * len(ledger), pairs
    for cause in set(truth.values()):
        n_true, n_said = Counter(truth.values())[cause], Counter(ledger.values())[cause]
        hits = pairs[(cause, cause)]
        if n_true >= 10:
            assert hits >= BAR * n_true and hits >= BAR * n_said, (cause, pairs)


def test_the_truth_is_the_engines_not_the_ledgers() -> None:
    """The true causes come from the trace's facts, not from what the ledger reads: a run with no fault at all
    and loose limits has no misses on either side, and the injected faults show in the trace itself."""
    v = case_run("vllm", "network")
    delayed = [e for e in v.trace if e["type"] == "request" and e["network_delay_ms"] > 0]
    assert delayed and all(e["network_delay_ms"] == 1500 for e in delayed)
    by_id = records_by_id(v)
    loose = {k: lim * 100 for k, lim in v.limits_ms.items()}
    assert true_misses(v.trace, by_id, loose) == {}
    misses = true_misses(v.trace, by_id, v.limits_ms)
    assert {rid for rid, m in misses.items() if m.cause == "network"} == {
        e["id"] for e in delayed if e["id"] in by_id}


def test_the_replay_observes_what_a_run_would() -> None:
    """The faults land where a real run would see them: a 500 at arrival with no tokens, headers when the
    request reached the engine, sends and reads held to a hog's end (and the loop lag showing it), scrapes in
    the engine's own series (llama.cpp exposes no KV usage or preemptions, vLLM does)."""
    v = case_run("vllm", "server_error")
    failed = v.requests.filter(pl.col("error_kind").is_not_null())
    assert failed.height > 0 and set(failed["http_status"]) == {500} and set(failed["error_kind"]) == {"http_5xx"}
    assert failed["chunks"].sum() == 0 and failed["t_first_token_ns"].null_count() == failed.height
    arrival = {e["id"]: e["t_arrival_ns"] for e in v.trace if e["type"] == "request"}
    heads = dict(zip(v.requests["seq"], v.requests["t_headers_ns"]))
    assert all(heads[seq] == arrival[rid] for rid, seq in v.seq_of.items() if rid in arrival)
    assert {"running", "waiting", "kv_cache_usage", "preemptions_total"} <= set(v.server["name"])
    assert v.server["t_ns"].unique().diff().drop_nulls().unique().to_list() == [500_000_000]
    lag = case_run("llamacpp", "client_lag")
    assert not {"kv_cache_usage", "preemptions_total"} & set(lag.server["name"])
    sent = lag.requests["t_sent_ns"].to_list() + lag.chunks["t_ns"].to_list() + lag.server["t_ns"].to_list()
    assert not any(a <= t < b for t in sent for a, b in HOGS_NS)  # nothing read, sent or scraped in a hog ...
    assert sum(t in {b for _, b in HOGS_NS} for t in sent) >= len(HOGS_NS)  # ... but at its end
    loop = lag.client.filter(pl.col("name") == "loop_lag_ms")
    for a, b in HOGS_NS[:-1]:  # each hog shows as a timer that fired at its end, up to 300 ms late
        fired = loop.filter(pl.col("t_ns") == b)["value"].to_list()
        assert len(fired) == 1 and 250 <= fired[0] <= 300
    assert loop.filter(~pl.col("t_ns").is_in([b for _, b in HOGS_NS]))["value"].max() == 0.0


# ---- the truth's rules on hand-made traces (the simulator's trace format, instants in ms) ---------------------
MS_NS = 1_000_000


def _trace(requests: dict[str, tuple[float, int, float]], steps: list[tuple[float, float, list[tuple[str, int]],
                                                                             list[str], float]],
           errors: tuple[str, ...] = ()) -> list[dict[str, object]]:
    """``requests``: id → (arrival ms, prompt tokens, network delay ms); ``steps``: (start, end, prefills
    [(id, tokens)], decodes, kv_usage); a step emits a token for each decode and each prefill that completes
    its prompt."""
    out: list[dict[str, object]] = [{"type": "request", "id": rid, "t_arrival_ns": int(t * MS_NS),
                                     "prompt_tokens": p, "network_delay_ms": d} for rid, (t, p, d) in requests.items()]
    out += [{"type": "finish", "id": rid, "t_ns": int(requests[rid][0] * MS_NS), "reason": "error", "status": 500}
            for rid in errors]
    done: dict[str, int] = {}
    emitted: dict[str, int] = {}
    for a, b, prefills, decodes, kv in steps:
        tokens = []
        for rid, n in prefills:
            done[rid] = done.get(rid, 0) + n
            if done[rid] >= requests[rid][1]:
                tokens.append(rid)
        for rid in tokens + decodes:
            tokens_index = emitted.get(rid, 0)
            emitted[rid] = tokens_index + 1
        out.append({"type": "step", "t_start_ns": int(a * MS_NS), "t_end_ns": int(b * MS_NS),
                    "prefill": [[rid, n, 0] for rid, n in prefills], "decode": decodes, "preempted": [],
                    "kv_usage": kv, "tokens": [[rid, emitted[rid] - 1, int(b * MS_NS)] for rid in tokens + decodes]})
    return out


def _rec(intended_ms: float, sent_ms: float, reads_ms: list[float], error: str | None = None) -> dict[str, object]:
    reads = [int(t * MS_NS) for t in reads_ms]
    return {"t_intended_ns": int(intended_ms * MS_NS), "t_sent_ns": int(sent_ms * MS_NS), "error_kind": error,
            "t_done_ns": reads[-1] if reads else int(sent_ms * MS_NS), "class_name": "c", "tokens_ns": reads}


def test_the_truth_weighs_the_engines_facts_in_the_ledgers_order() -> None:
    ttft = {"ttft_ms": 1000.0}
    # an error; a request held 1,500 ms on its way in; a 20k-token prompt whose own prefill is 1,500 ms
    t = _trace({"e": (0, 100, 0), "n": (1501, 100, 1500), "o": (0, 20000, 0)},
               [(0, 1500, [("o", 20000)], [], 0.1), (1501, 1511, [("n", 100)], [], 0.1)], errors=("e",))
    recs = {"e": _rec(0, 0, [], "http_5xx"), "n": _rec(0, 0, [1511]), "o": _rec(0, 0, [1500])}
    assert true_causes(t, recs, ttft) == {"e": "server_error", "n": "network", "o": "own_prompt"}
    # a short prompt waiting 1,200 ms behind another's long prefill: queueing, or preemption on a full KV cache
    for kv, cause in ((0.5, "queueing"), (0.97, "preemption")):
        t = _trace({"q": (0, 100, 0), "o": (0, 20000, 0)},
                   [(0, 1200, [("o", 20000)], [], kv), (1200, 1210, [("q", 100)], ["o"], 0.5)])
        assert true_causes(t, {"q": _rec(0, 0, [1210])}, ttft) == {"q": cause}
    # on an engine that reserves KV at admission (llama.cpp, TGI: the trace's engine line) that wait is queueing
    engine_line: list[dict[str, object]] = [{"type": "engine", "engine": "tgi", "reserves_kv": True}]
    assert true_causes(engine_line + t, {"q": _rec(0, 0, [1210])}, ttft) == {"q": "queueing"}
    # sent 400 ms late (loadgen's own lag), served at once
    t = _trace({"c": (401, 100, 0)}, [(401, 411, [("c", 100)], [], 0.1)])
    assert true_causes(t, {"c": _rec(0, 400, [411])}, {"ttft_ms": 200.0}) == {"c": "client_lag"}


def test_the_truth_names_a_gaps_cause() -> None:
    itl = {"itl_ms": 100.0}
    # a victim's decode paused 800 ms by another's 10k-token prefill; else by loadgen's loop blocked until 500 ms
    t = _trace({"v": (0, 100, 0), "big": (15, 10000, 0)},
               [(0, 10, [("v", 100)], [], 0.1), (10, 20, [], ["v"], 0.1), (20, 820, [("big", 10000)], ["v"], 0.1),
                (820, 830, [], ["v", "big"], 0.1)])
    assert true_causes(t, {"v": _rec(0, 0, [10, 20, 820, 830])}, itl, long_prompt_tokens=4000) == {"v": "prefill"}
    t = _trace({"v": (0, 100, 0)}, [(0, 10, [("v", 100)], [], 0.1), (10, 20, [], ["v"], 0.1),
                                    (20, 30, [], ["v"], 0.1)])
    assert true_causes(t, {"v": _rec(0, 0, [10, 20, 500])}, itl, hogs_ns=[(25 * MS_NS, 500 * MS_NS)]) == {
        "v": "client_lag"}
    assert true_causes(t, {"v": _rec(0, 0, [10, 20, 30])}, itl) == {}  # the same stream, read on time
