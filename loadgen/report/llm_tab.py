"""The rows of the Locust web UI's LLM tab: exact percentiles, SLOs and stalls recomputed from the raw records
(not Locust's rounded histogram). Pure: records in, rows out."""

from __future__ import annotations

from typing import Any

from loadgen.analysis.result import RunResult
from loadgen.plan.scenario import Scenario

LLM_TAB = {"title": "LLM", "key": "llm"}
LLM_TABLE = {"key": "llm", "structure": [
    {"key": "name", "title": "metric / objective"}, {"key": "cls", "title": "class"},
    {"key": "count", "title": "samples"}, {"key": "p50", "title": "p50 (ms)"}, {"key": "p90", "title": "p90 (ms)"},
    {"key": "p99", "title": "p99 (ms)"}, {"key": "max", "title": "max (ms)"}, {"key": "note", "title": "result"}]}


def live_rows(scenario: Scenario, records: list[Any], planned: int | None) -> list[dict[str, Any]]:
    """The LLM tab's rows, exact (from the raw records, not Locust's rounded histogram)."""
    from loadgen.analysis.summary import summarize
    from loadgen.records.schema import chunks_frame, requests_frame

    requests = requests_frame([r for r, _ in records])
    chunks = chunks_frame([c for _, cs in records for c in cs])
    summary, _ = summarize(scenario, requests, chunks, planned, ledger=False)  # the tab shows no causes
    result = RunResult.from_dict(summary)
    rows = []  # Locust's table sorts rows by name: the prefixes keep latency, SLOs and stalls together
    classes = list(result.classes.items())
    blocks = [("all", result.metrics), *((c, b["metrics"]) for c, b in (classes if len(classes) > 1 else []))]
    for cls, metrics in blocks:
        for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            m = metrics[name]
            rows.append({"name": f"latency · {name}", "cls": cls, "count": m["count"],
                         **{k: _ms(m[k]) for k in ("p50", "p90", "p99", "max")}, "note": ""})  # type: ignore
    for o in result.slo:
        state = {True: "pass", False: "FAIL", None: "inconclusive"}[o["passed"]]
        rows.append({"name": f"slo · {o['objective']}", "cls": "all", "count": o["samples"], "p50": "",
                     "p90": "", "p99": "", "max": "",
                     "note": f"{state}: {_ms(o['value'])} {o['comparison']} {o['threshold']}"})
    st = result.stalls
    rows.append({"name": "stalls", "cls": "all", "count": st["count"], "p50": "", "p90": "",
                 "p99": "", "max": _ms(st.get("worst_gap_ms")),
                 "note": f"{st['prefill_induced']} prefill-induced; {st['per_1k_tokens']:.2f} per 1k tokens"})
    return rows


def _ms(value: Any) -> str:
    return "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)
