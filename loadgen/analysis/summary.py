"""The run's summary (DESIGN §7 ``summary.json`` shape), overall and per class, from raw records."""

from __future__ import annotations

from typing import Any

import polars as pl

from loadgen.analysis import server_frames
from loadgen.plan.scenario import Scenario
from loadgen.analysis import metrics as m
from loadgen.analysis import spikes
from loadgen.analysis import figures as fig
from loadgen.analysis.ledger import Ledger, miss_ledger
from loadgen.analysis.conversations import conversation_figures
from loadgen.analysis.reasoning import reasoning_figures, tool_figures
from loadgen.analysis.sessions import SessionFrames
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.run_findings import run_findings
from loadgen.analysis.objective_samples import ObjectiveSamples
from loadgen.analysis.generator_load import saturated_processes
from loadgen.analysis.generator_lag import cap_note, lag_figures
from loadgen.analysis.slo import evaluate, evidence, verdict
from loadgen.analysis.slo_stalls import stall_objectives


def summarize(scenario: Scenario, requests: pl.DataFrame, chunks: pl.DataFrame | pl.LazyFrame, planned: int | None,
              extra: dict[str, Any] | None = None, server: pl.DataFrame | None = None,
              run: RunAnalysis | None = None, client: pl.DataFrame | None = None, ledger: bool = True,
              ) -> tuple[dict[str, Any], dict[str, pl.DataFrame]]:
    """The summary (summary.json) and the derived tables written beside it (``stalls``, ``misses``: the
    SLO-miss ledger, analysis/ledger.py). ``server``: the scraped server metrics (server_metrics.parquet), whose
    preemptions confirm stall causes and miss causes. ``run``: these records' analysis, when the caller keeps
    it for the report's views (else made here). ``client``: loadgen's own metrics (client_metrics.parquet: its
    loop lag), None where the run has none. ``ledger``: False where only the verdict and figures are judged (a
    candidate replay of advise, size, until): no miss ledger (no ``misses``, no table), at no cost."""
    run = run or RunAnalysis(requests, chunks, scenario.load.steady_state)
    req, measured = run.req, run.measured
    good = _good(measured, scenario)
    counts = m.request_counts(measured)
    unfinished = list((extra or {}).get("sessions_not_finished") or [])
    frames = _session_frames(measured, scenario, unfinished) if "session" in run.families else None
    metric_table = m.metric_table(measured, token_stats=run.token_stats(), kinds=run.families,
                                  session_stats=frames.stats() if frames else None)
    tput = _throughput(measured, good, scenario)
    spike = spikes.analyze(prefilled(req), prefilled(measured), run,
                           spikes.config_from(scenario.slo, scenario.load.max_in_flight),
                           server_frames.preemption_windows(server))
    misses = miss_ledger(run, scenario.slo, spike, server, client, scenario.load.max_in_flight) if ledger else None
    samples = _samples(measured, run, scenario, frames)
    sessions = frames.figures() if frames else None
    objectives = evaluate(scenario.slo, metric_table, counts, int(good.sum()), measured.height,
                          tput["goodput_requests_per_s"], samples, sessions)
    objectives += stall_objectives(scenario.slo, measured, run.wide(), spike.summary, samples)
    result, reasons, lag = _verdict(scenario, objectives, req, extra or {})
    result, reasons = evidence(result, reasons, counts, extra or {})
    if run.steady.reached is False:  # the figures are over a run that never settled: say so beside the verdict
        reasons = reasons + [f"steady state was not reached ({run.steady.reason}): the figures are over every "
                             "measured request"]
    return {
        "verdict": result,
        "reasons": reasons,
        "requests": {"planned": planned, "sent": requests.height, "warmup": int(requests["warmup"].sum()),
                     "transient": run.steady.transient, **counts},
        "steady_state": run.steady.as_dict(),  # the window measured (analysis/steady.py); its cuts: transient_requests
        "generator_lag": lag,  # the lag rule's figure beside the queue delay it is taken from (generator_lag.py)
        "metrics": metric_table,
        "throughput": tput,
        **quoted_figures(scenario, measured, tput, server, metric_table),
        "slo": [o.as_dict() for o in objectives],
        "decision": {"rule": scenario.slo.decision, "confidence": scenario.slo.confidence},
        "stalls": spike.summary,
        **({"misses": misses.summary} if misses else {}),
        "classes": _per_class(measured, run, scenario, spike.per_class, unfinished, misses),
        "lengths": _lengths(measured, [c.name for c in scenario.workload.classes if c.dataset is not None]),
        "window_s": m.window_s(measured),
        "server": server_frames.summary_of(server),
        "conversations": conversation_figures(measured),
        "reasoning": reasoning_figures(measured, [c.name for c in scenario.workload.classes]),
        "tools": tool_figures(measured),
        "sessions": sessions,
        "findings": run_findings(requests, run.chunks),  # what limits the measurement (loadgen check's signs)
        **(extra or {}),
    }, {"stalls": spike.stalls, **({"misses": misses.misses} if misses else {}),
        **(frames.tables() if frames else {})}


def _throughput(measured: pl.DataFrame, good: pl.Series, scenario: Scenario) -> dict[str, Any]:
    """Requests, prompt, output and total (prompt + output) tokens, and goodput per second; whether goodput
    has limits of its own (``slo.goodput``) or is every completed request."""
    tput = m.throughput(measured, good)
    return {**tput, "total_tokens_per_s": tput["prompt_tokens_per_s"] + tput["output_tokens_per_s"],
            "goodput_declared": scenario.slo.goodput is not None}


def quoted_figures(scenario: Scenario, measured: pl.DataFrame, tput: dict[str, float],
                   server: pl.DataFrame | None, metric_table: dict[str, Any]) -> dict[str, Any]:
    """summary.json's ``figures`` (cost per million tokens and energy per token over the measured window, each
    absent with its reason in ``absent`` where its input is missing) and ``mlperf`` (analysis/figures.py)."""
    window_s = m.window_s(measured)
    output = tput["output_tokens_per_s"] * window_s
    total = tput["total_tokens_per_s"] * window_s
    edges = None if measured.is_empty() else (int(measured["t_intended_ns"].min()),  # type: ignore[arg-type]
                                              int(measured["t_done_ns"].max()))  # type: ignore[arg-type]
    cost = fig.cost_figures(scenario.cost, window_s, output, total)
    energy = fig.energy_figures(server, edges, bool(scenario.target.power_metrics), output, total)
    return {"figures": {**cost, **energy, "absent": {**cost["absent"], **energy["absent"]}},
            "mlperf": fig.mlperf(metric_table)}


def _session_frames(measured: pl.DataFrame, scenario: Scenario,
                    not_finished: list[int] | None = None) -> SessionFrames:
    """The measured sessions (analysis/sessions.py), good by ``slo.sessions.good``'s limits."""
    spec = scenario.slo.sessions
    return SessionFrames(measured, m.window_s(measured), spec.good.model_dump() if spec else None, not_finished)


def prefilled(requests: pl.DataFrame) -> pl.DataFrame:
    """The stall analysis judges a prefill by the tokens it computed: with prefix caching, a prompt less the
    tokens the server's cache held (``cached_tokens``, where the server said). A conversation's later turn
    carries a long history but may prefill only its new message."""
    if requests["cached_tokens"].null_count() == requests.height:
        return requests
    return requests.with_columns(prompt_tokens=pl.col("prompt_tokens") - pl.col("cached_tokens").fill_null(0))


def _samples(measured: pl.DataFrame, run: RunAnalysis, scenario: Scenario,
             frames: SessionFrames | None) -> ObjectiveSamples:
    """The objectives' samples: the successful requests', the sessions' and steps', and the cancelled
    requests' censored waits."""
    return ObjectiveSamples(measured.filter(pl.col("ok")), run, scenario.slo.confidence,
                            frames.sessions if frames else None, frames.steps if frames else None,
                            measured.filter(pl.col("error_kind") == "cancelled"))


def _processes(req: pl.DataFrame, extra: dict[str, Any]) -> int:
    """The sending processes the cap was dealt over: the generator's count, else the records' workers."""
    n = (extra.get("generator") or {}).get("processes")
    return int(n) if n else int(req["worker"].max() or 0) + 1 if req.height else 1  # type: ignore[operator]


def _verdict(scenario: Scenario, objectives: list[Any], req: pl.DataFrame,
             extra: dict[str, Any]) -> tuple[str, list[str], dict[str, Any]]:
    """The objectives' verdict under the generator's two health rules: its own lateness (p99 client_lag_ms of
    ``req``, every request: analysis/generator_lag.py; a cap the server kept full is noted, not held against
    loadgen) and the CPU of each sending process (analysis/generator_load.py); either makes the run
    inconclusive. Also the lag rule's figures (summary.json's ``generator_lag``)."""
    lag = lag_figures(req, scenario.load.max_in_flight, _processes(req, extra), scenario.slo.max_generator_lag_ms)
    result, reasons = verdict(objectives, lag["client_lag_p99_ms"], scenario.slo.max_generator_lag_ms)
    note = cap_note(lag)
    reasons = reasons + ([note] if note else [])
    cpu_bound = saturated_processes(extra.get("generator"), scenario.slo.max_generator_cpu)
    if cpu_bound:
        result, reasons = "inconclusive", cpu_bound + (reasons if result == "inconclusive" else [])
    return result, reasons, lag


def _good(requests: pl.DataFrame, scenario: Scenario) -> pl.Series:
    """Per request: met every goodput limit of the scenario (just: finished without error, if none)."""
    g = scenario.slo.goodput
    return m.is_good(requests, g.ttft_ms if g else None, g.tpot_ms if g else None, g.e2e_ms if g else None)


def _per_class(measured: pl.DataFrame, run: RunAnalysis, scenario: Scenario, stalls: dict[str, dict[str, Any]],
               not_finished: list[int], ledger: Ledger | None) -> dict[str, Any]:
    """Each class's counts, metric rows and misses; its session rows leave out the sessions the run's end cut
    short (``not_finished``), as the run's own do."""
    out = {}
    for cls in scenario.workload.classes:
        req = measured.filter(pl.col("class_name") == cls.name)
        good = _good(req, scenario)
        frames = _session_frames(req, scenario, not_finished) if "session" in run.families else None
        out[cls.name] = {"requests": m.request_counts(req),
                         "metrics": m.metric_table(req, token_stats=run.token_stats(cls.name), kinds=run.families,
                                                   session_stats=frames.stats() if frames else None),
                         "throughput": m.throughput(req, good), "stalls": stalls.get(cls.name, {}),
                         **({"misses": ledger.of_class(cls.name, req.height)} if ledger else {})}
    return out


def _lengths(measured: pl.DataFrame, from_datasets: list[str]) -> dict[str, Any]:
    """Asked vs achieved prompt and output lengths (achieved from the server's usage where it reported it). A
    dataset's prompts are sent as they are (their asked length is an estimate): not judged."""
    ok = measured.filter(pl.col("ok"))
    out: dict[str, Any] = {}
    for kind in ("prompt", "output"):
        # a conversation's later turn (a session's released call) asks for its new message; the server counts
        # the history too
        first = pl.col("turn").fill_null(0) == 0
        if "after_call" in ok.columns:
            first = first & pl.col("after_call").is_null()
        rows = ok.filter(first & ~pl.col("class_name").is_in(from_datasets)) if kind == "prompt" else ok
        asked, got = rows[f"{kind}_tokens_asked"], rows[f"{kind}_tokens"]
        diff = (got - asked).abs() if rows.height else pl.Series([], dtype=pl.Int64)
        out[kind] = {"exact": int((diff == 0).sum()), "requests": rows.height,
                     "max_abs_diff": int(diff.max()) if rows.height else 0,  # type: ignore[arg-type]
                     "source": sorted(set(rows[f"{kind}_tokens_source"].to_list()))}
    return out
