"""A scenario run through the simulator's scheduler in virtual time (``loadgen.advise.replay``), with the ground
truth the real-time simulator's trace would hold: stall attribution scored in a fraction of a second per engine
instead of a 30 s real-time run each (tests/test_spike_truth.py keeps one real-time run end to end).

The plan is the scenario's own (``build_plan``: its seeded arrivals and lengths); the engine is the one the
embedded simulator would start for it (``build_config`` of its preset and overrides); the records go through the
same analysis as a measured run's (``summarize``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from local_target.sim import build_config
from local_target.sim.engine import SimRequest, Step
from loadgen import api
from loadgen.advise.replay import ReplayLoad, ReplayRequest, replay
from loadgen.records.schema import chunks_frame, requests_frame
from loadgen.analysis.summary import summarize
from loadgen.plan.schedule import build_plan

ARRIVAL_DELAY_MS = 1.0  # the request's way to the engine outside its steps (loopback HTTP, parsing)


@dataclass
class VirtualRun:
    summary: dict[str, Any]
    requests: pl.DataFrame
    chunks: pl.DataFrame
    stalls: pl.DataFrame
    trace: list[dict[str, Any]]  # the simulator's trace events: "request" and "step" (local_target/sim/trace.py)
    seq_of: dict[str, int]  # engine request id → seq


def virtual_run(path: str | Path, overrides: list[str]) -> VirtualRun:
    scenario = api.load_scenario(path, overrides)
    plan = build_plan(scenario)
    assert plan.requests is not None and not plan.closed_loop, "open-loop plans only"
    spec = scenario.target.simulator
    cfg = build_config(spec.preset_name, overrides=spec.overrides())
    reqs = [ReplayRequest(r.seq, 0, r.class_name, r.warmup, r.t_intended_offset_ns, r.prompt_tokens,
                          r.output_tokens) for r in plan.requests]
    trace: list[dict[str, Any]] = [{"type": "request", "id": f"0-{r.seq}", "prompt_tokens": r.prompt_tokens}
                                   for r in reqs]

    def on_step(step: Step, t_start_ns: int, t_end_ns: int, emitted: list[tuple[SimRequest, int]]) -> None:
        trace.append({"type": "step", "t_start_ns": t_start_ns, "t_end_ns": t_end_ns,
                      "prefill": [[r.id, c.tokens, c.start] for r, c in step.prefills],
                      "decode": [r.id for r in step.decodes], "preempted": [r.id for r in step.preempted],
                      "tokens": [[r.id, index, t_end_ns] for r, index in emitted]})
    load = ReplayLoad(None, scenario.load.max_in_flight, ARRIVAL_DELAY_MS, scenario.load.drain_timeout_s)
    records, chunk_records = replay(cfg, reqs, load, on_step=on_step)
    requests, chunks = requests_frame(records), chunks_frame(chunk_records)
    summary, tables = summarize(scenario, requests, chunks, plan.size)
    return VirtualRun(summary, requests, chunks, tables["stalls"], trace, {f"0-{r.seq}": r.seq for r in reqs})
