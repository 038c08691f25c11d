"""A scenario run through the simulator's scheduler in virtual time (``loadgen.advise.replay``), with the ground
truth the real-time simulator's trace would hold: stall attribution scored in a fraction of a second per engine
instead of a 30 s real-time run each (tests/test_spike_truth.py keeps one real-time run end to end).

The plan is the scenario's own (``build_plan``: its seeded arrivals and lengths); the engine is the one the
embedded simulator would start for it (``build_config`` of its preset and overrides); the records go through the
same analysis as a measured run's (``summarize``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import polars as pl

from local_target.sim import build_config
from local_target.sim.costmodel import prefill_alone_ms
from loadgen import api
from loadgen.advise.replay import ReplayLoad, ReplayRequest, replay_observed
from loadgen.advise.replay_observe import ReplayFaults
from loadgen.records.schema import chunks_frame, requests_frame
from loadgen.analysis.ledger import limits_of
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.summary import summarize
from loadgen.plan.schedule import build_plan

ARRIVAL_DELAY_MS = 1.0  # the request's way to the engine outside its steps (loopback HTTP, parsing)
METRICS_SCHEMA = {"t_ns": pl.Int64, "name": pl.String, "value": pl.Float64}


@dataclass
class VirtualRun:
    summary: dict[str, Any]
    requests: pl.DataFrame
    chunks: pl.DataFrame
    stalls: pl.DataFrame
    trace: list[dict[str, Any]]  # the simulator's trace events: "request", "step", "finish" (local_target/sim/trace.py)
    seq_of: dict[str, int]  # engine request id → seq
    tables: dict[str, pl.DataFrame]  # summarize's tables ("stalls", and "misses" where the ledger gives it)
    server: pl.DataFrame  # server_metrics.parquet's rows, scraped from the engine every 0.5 s
    client: pl.DataFrame  # client_metrics.parquet's rows (loop lag every 50 ms: 0 but in the hogs)
    hogs_ns: tuple[tuple[int, int], ...]
    measured: set[int]  # the seqs loadgen's analysis judged (RunAnalysis.measured)
    limits_ms: dict[str, float]  # the ledger's limits (analysis/ledger.py's limits_of)
    prefill_ms: Callable[[int], float]  # the engine's time to prefill n prompt tokens alone (its cost model)


def virtual_run(path: str | Path, overrides: list[str], hogs_ns: tuple[tuple[int, int], ...] = ()) -> VirtualRun:
    """The scenario replayed with its simulator's faults (``faults.error_rate``, ``faults.network_delay_*``) and
    loadgen's loop blocked over ``hogs_ns`` (ns from the run's start)."""
    scenario = api.load_scenario(path, overrides)
    plan = build_plan(scenario)
    assert plan.requests is not None and not plan.closed_loop, "open-loop plans only"
    spec = scenario.target.simulator
    cfg = build_config(spec.preset_name, overrides=spec.overrides())
    reqs = [ReplayRequest(r.seq, 0, r.class_name, r.warmup, r.t_intended_offset_ns, r.prompt_tokens,
                          r.output_tokens) for r in plan.requests]
    faults = ReplayFaults(cfg.faults.error_rate, cfg.faults.network_delay_ms, cfg.faults.network_delay_rate,
                          tuple(hogs_ns), scenario.seed)
    load = ReplayLoad(None, scenario.load.max_in_flight, ARRIVAL_DELAY_MS, scenario.load.drain_timeout_s)
    out = replay_observed(cfg, reqs, load, faults)
    requests, chunks = _with_transport(requests_frame(out.records), out.headers_ns), chunks_frame(out.chunks)
    server = pl.DataFrame(out.server, schema=METRICS_SCHEMA, orient="row")
    client = pl.DataFrame(out.client, schema=METRICS_SCHEMA, orient="row")
    kwargs: dict[str, Any] = {"server": server}
    if "client" in inspect.signature(summarize).parameters:  # the ledger's loop-lag evidence (issue 39)
        kwargs["client"] = client
    run = RunAnalysis(requests, chunks, scenario.load.steady_state)
    summary, tables = summarize(scenario, requests, chunks, plan.size, run=run, **kwargs)
    return VirtualRun(summary, requests, chunks, tables["stalls"], out.trace, {f"0-{r.seq}": r.seq for r in reqs},
                      tables, server, client, tuple(hogs_ns), set(run.measured["seq"].to_list()),
                      limits_of(scenario.slo), lambda n: prefill_alone_ms(cfg, n) * cfg.time_scale)


def _with_transport(requests: pl.DataFrame, headers_ns: dict[tuple[int, int], int]) -> pl.DataFrame:
    """``connect_ns`` and ``t_headers_ns`` where the records' schema does not carry them yet."""
    if "t_headers_ns" in requests.columns:
        return requests
    keys = requests.select("worker", "seq").rows()
    return requests.with_columns(connect_ns=pl.lit(0, pl.Int64),
                                 t_headers_ns=pl.Series([headers_ns.get(k) for k in keys], dtype=pl.Int64))


def records_by_id(v: VirtualRun) -> dict[str, dict[str, Any]]:
    """The measured requests' record fields and token read times, by engine id (``truth_causes``'s input)."""
    reads: dict[int, list[int]] = {}
    for seq, t_ns in v.chunks.sort("seq", "t_ns").select("seq", "t_ns").iter_rows():
        reads.setdefault(seq, []).append(t_ns)
    out = {}
    for row in v.requests.filter(pl.col("seq").is_in(list(v.measured))).iter_rows(named=True):
        out[f"{row['worker']}-{row['seq']}"] = {**row, "tokens_ns": reads.get(row["seq"], [])}
    return out
