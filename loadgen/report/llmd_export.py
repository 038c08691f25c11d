"""``benchmark_report.yaml``: a run's summary as llm-d's Benchmark Report v0.2, for results stores that read it.

The models followed: llm-d/llm-d-benchmark, benchmark_report/schema_v0_2.py (BenchmarkReportV02 and the models
under it; every one ``extra="forbid"``) and benchmark_report/base.py (``Units``: "count", "ms", "ms/token",
"tokens/s", "queries/s"), read at commit 08e0c227ecc1. What is written: ``version``, ``run`` (uid: the run
directory's name, eid: the scenario's name, time.start and time.duration: the measured window), ``scenario.load``
(metadata, standardized, native: the scenario as run.json keeps it, secrets masked) and
``results.request_performance.aggregate`` (requests, latency, throughput). ``scenario.stack`` is left out (we
do not know the serving stack's components). v0.2 has no cost or energy field: loadgen's ``figures`` and
``mlperf`` blocks go under ``results.profiling`` (typed Any there), under the key ``loadgen``. Pure: a dict.
"""

from __future__ import annotations

import datetime
from typing import Any

from loadgen.core.secrets import redact_url

VERSION = "0.2"
LATENCY = {"time_to_first_token": ("ttft_ms", "ms"), "time_per_output_token": ("tpot_ms", "ms/token"),
           "inter_token_latency": ("itl_ms", "ms/token"), "request_latency": ("e2e_ms", "ms")}
STATS = {"mean": "mean", "p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "p999": "p99p9", "max": "max"}


def statistics(row: dict[str, Any] | None, units: str) -> dict[str, Any] | None:
    """A metric row of summary.json as a v0.2 ``Statistics`` (its ``mean`` is required: no mean, none)."""
    if not row or row.get("mean") is None:
        return None
    return {"units": units, **{theirs: row[ours] for ours, theirs in STATS.items() if row.get(ours) is not None}}


def _iso(started_at: str | None) -> str | None:
    try:
        return datetime.datetime.strptime(started_at or "", "%Y-%m-%dT%H:%M:%S%z").isoformat()
    except ValueError:
        return None


def sequence_length(dist: dict[str, Any] | None, measured_mean: float | None) -> dict[str, Any] | None:
    """A length distribution of the scenario as a v0.2 ``SequenceLength``; a shape v0.2 lacks (lognormal,
    exponential, empirical, mixture, a dataset, several classes) is ``other`` at the measured mean."""
    d = dist or {}
    if d.get("dist") == "fixed":
        return {"distribution": "fixed", "value": d["value"]}
    if d.get("dist") == "normal":
        return _clip({"distribution": "gaussian", "value": d["mean"], "std_dev": d["std"]}, d)
    if d.get("dist") == "uniform":
        return _clip({"distribution": "random", "value": (d["min"] + d["max"]) / 2}, d)
    if measured_mean is None or measured_mean < 1:
        return None
    return {"distribution": "other", "value": measured_mean}


def _clip(out: dict[str, Any], dist: dict[str, Any]) -> dict[str, Any]:
    return {**out, **{k: dist[k] for k in ("min", "max") if dist.get(k) is not None}}


def load(scenario: dict[str, Any], summary: dict[str, Any], tool_version: str) -> dict[str, Any]:
    """``scenario.load``: the workload in standardized form and the scenario itself as native config."""
    classes = scenario["workload"]["classes"]
    only = classes[0] if len(classes) == 1 else {}
    tput, load_spec = summary.get("throughput") or {}, scenario["load"]
    per_request = tput.get("requests_per_s") or 0.0
    mean_in = tput.get("prompt_tokens_per_s", 0.0) / per_request if per_request else None
    mean_out = tput.get("output_tokens_per_s", 0.0) / per_request if per_request else None
    standardized = {"tool": "loadgen", "tool_version": tool_version,
                    "source": "sampled" if any(c.get("dataset") for c in classes) else "random",
                    "input_seq_len": sequence_length(only.get("prompt_tokens"), mean_in),
                    "output_seq_len": sequence_length(only.get("output_tokens"), mean_out),
                    "rate_qps": load_spec.get("rate_per_s"), "concurrency": load_spec.get("concurrency")}
    if any(c.get("conversation") for c in classes):
        standardized["multi_turn"] = {"enabled": True}
    native = dict(scenario, target={**scenario["target"], "power_metrics": [
        redact_url(u) for u in scenario["target"].get("power_metrics", [])]})
    return {"metadata": {"schema_version": "0.0.1", "description": scenario.get("description") or scenario["name"]},
            "standardized": {k: v for k, v in standardized.items() if v is not None},
            "native": {"config": native}}


def aggregate(summary: dict[str, Any]) -> dict[str, Any]:
    """``results.request_performance.aggregate``: request counts, latency and throughput."""
    req, metrics, tput = summary.get("requests") or {}, summary.get("metrics") or {}, summary.get("throughput") or {}
    per_request = tput.get("requests_per_s") or 0.0
    lengths = {name: {"units": "count", "mean": tput[key] / per_request}
               for name, key in (("input_length", "prompt_tokens_per_s"), ("output_length", "output_tokens_per_s"))
               if per_request and key in tput}
    latency = {theirs: statistics(metrics.get(ours), units) for theirs, (ours, units) in LATENCY.items()}
    rates = {"input_token_rate": ("prompt_tokens_per_s", "tokens/s"),
             "output_token_rate": ("output_tokens_per_s", "tokens/s"),
             "total_token_rate": ("total_tokens_per_s", "tokens/s"), "requests_rate": ("requests_per_s", "queries/s")}
    throughput = {theirs: {"units": units, "mean": tput[ours]} for theirs, (ours, units) in rates.items()
                  if tput.get(ours) is not None}
    total = sum(int(req.get(k) or 0) for k in ("completed", "failed", "cancelled"))
    return {"requests": {"total": total, "failures": int(req.get("failed") or 0),
                         "incomplete": int(req.get("cancelled") or 0), **lengths},
            "latency": {k: v for k, v in latency.items() if v is not None},
            "throughput": throughput}


def benchmark_report(summary: dict[str, Any], scenario: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The Benchmark Report v0.2 of one run: ``summary`` as summary.json holds it, ``scenario`` as run.json
    keeps it (secrets masked), ``run_id`` the run directory's name."""
    window_s = float(summary.get("window_s") or 0.0)
    time = {"start": _iso(summary.get("started_at")), "duration": f"PT{window_s:.3f}S"}
    workload = load(scenario, summary, summary.get("loadgen_version") or "unknown")
    return {"version": VERSION,
            "run": {"uid": run_id, "eid": scenario["name"], "time": {k: v for k, v in time.items() if v}},
            # input_seq_len is required: a run with no completed request of an unstated length has no load block
            **({"scenario": {"load": workload}} if "input_seq_len" in workload["standardized"] else {}),
            "results": {"request_performance": {"aggregate": aggregate(summary)},
                        "profiling": {"loadgen": {"figures": summary.get("figures") or {},
                                                  "mlperf": summary.get("mlperf") or {}}}}}
