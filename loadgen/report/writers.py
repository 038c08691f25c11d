"""summary.json, summary.md (fits $GITHUB_STEP_SUMMARY) and junit.xml (one test case per SLO objective)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping
from xml.etree import ElementTree as ET

from loadgen.core.vocabulary import METRICS
from loadgen.core.engines import ENGINES
from loadgen.core.secrets import write_bytes, write_text
from loadgen.analysis.result import RunResult
from loadgen.report.conversation_report import conversations_markdown
from loadgen.report.misses_report import misses_markdown, misses_of
from loadgen.report.session_report import sessions_markdown
from loadgen.report.fit import EXPLAIN, legend
from loadgen.analysis.figures import result_line
from loadgen.report.wording import (LIFT_WORDS, decision_words, fmt, interval_words, margin_words, samples_words,
                                    throughput_words, value_words)

ROWS = tuple(METRICS)  # one table row per metric (core/vocabulary.py)
COLS = ("count", "mean", "p50", "p90", "p95", "p99", "p999", "max")
ICON = {"pass": "✅ PASS", "fail": "❌ FAIL", "inconclusive": "⚠️ INCONCLUSIVE"}


def md_escape(text: str) -> str:
    """Text from the scenario or the server, made inert in Markdown/HTML."""
    out = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`*_{}[]|#":
        out = out.replace(ch, "\\" + ch)
    return out


def summary_markdown(result: RunResult, name: str, images: list[tuple[str, str]] | None = None) -> str:
    req = result.requests
    lines = [f"## loadgen: {md_escape(name)} — {ICON[result.verdict]}", ""]
    lines += [f"- {md_escape(r)}" for r in result.reasons]
    lines += ["", target_line(result.target or {})]
    lines += [f"\nNote: {md_escape(n)}" for n in result.notes]
    lines += [f"\nFinding: {md_escape(f['summary'])} (see `loadgen check`)" for f in result.findings]
    lines += ["", f"Requests: {req['completed']} completed, {req['failed']} failed, {req['cancelled']} cancelled "
              f"(of {fmt(req['planned'])} planned; {req['warmup']} warm-up excluded"
              f"{_transient_words(result)}). "
              f"Throughput: {throughput_words(result)}.", ""]
    lines += [f"{md_escape(quoted)} (docs/figures.md)", ""] if (quoted := result_line(result)) else []
    if result.slo:
        words = decision_words(result)
        lines += [f"SLOs {words}." if words else "SLOs:", "",
                  "| SLO | value | interval | threshold | margin | samples | result |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for o in result.slo:
            state = {True: "pass", False: "**FAIL**", None: "inconclusive"}[o["passed"]]
            lines.append(f"| `{o['objective']}` | {value_words(dict(o))} | {interval_words(dict(o))} | "
                         f"{o['comparison']} {fmt(o['threshold'])} | {margin_words(dict(o))} | {samples_words(o)} | "
                         f"{state} |")
        lines.append("")
    lines += ["| metric | unit | " + " | ".join(COLS) + " |", "| --- | --- |" + " ---: |" * len(COLS)]
    for row in rows_of(result):
        stats = result.metrics[row]
        lines.append(f"| {row} | {METRICS[row].unit} | " + " | ".join(fmt(stats[c]) for c in COLS) + " |")
    lines += ["", f"*{md_escape(legend(rows_of(result)) or EXPLAIN)}*"]
    errors = req.get("errors_by_kind") or {}
    if errors:
        lines += ["", "Errors by kind: " + ", ".join(f"`{k}` {v}" for k, v in errors.items())]
    lines += ["", _lengths_line(result.lengths), ""]
    lines += conversations_markdown(result)
    lines += sessions_markdown(result, md_escape)
    lines += stalls_markdown(result)
    lines += misses_markdown(result, md_escape)
    if images:
        lines += ["### Charts", "", "Interactive versions in `report.html`.", ""]
        lines += [f"![{md_escape(title)}]({path})" for title, path in images] + [""]
    return "\n".join(lines)


def rows_of(result: RunResult) -> tuple[str, ...]:
    """The metric rows this run has, in the vocabulary's order (a family's rows only where the run has it)."""
    return tuple(row for row in ROWS if row in result.metrics)


def target_line(target: dict[str, Any], esc: Callable[[str], str] = md_escape) -> str:
    """The target in words, its server-given parts (model, URL, preset) made inert by ``esc``: Markdown's here;
    report.html passes ``str`` and escapes the whole line once (escaping it twice showed ``a&amp;amp;b``)."""
    if not target:
        return ""
    model = esc(str(target.get("model")))
    sim = target.get("simulator")
    if sim:
        chunked = f"chunked prefill on, budget {sim['max_num_batched_tokens']} tokens" if sim["chunked_prefill"] \
            else "chunked prefill off"
        return (f"Target: the embedded simulator ({ENGINES[sim.get('engine', 'vllm')].label}'s scheduler, preset "
                f"{esc(sim['preset'])}, {chunked}, KV cache {sim['kv_cache_tokens']} tokens, time scale "
                f"{sim['time_scale']:g}), model {model}.")
    engine = ENGINES.get(target.get("engine") or "")
    made = f" ({engine.label})" if engine else ""
    return f"Target: {esc(str(target.get('base_url')))}{made}, model {model}."


def _lengths_line(lengths: dict[str, Any]) -> str:
    parts = []
    for kind in ("prompt", "output"):
        if kind in lengths:
            x = lengths[kind]
            parts.append(f"{kind} {x['exact']}/{x['requests']} exact (max diff {x['max_abs_diff']})")
    return "Asked vs achieved lengths: " + "; ".join(parts) if parts else ""


def junit_xml(result: RunResult, name: str) -> bytes:
    """One test case per SLO objective (failure: value and threshold; skipped: inconclusive), run facts as
    properties, the verdict's reasons as system-out. Valid against the JUnit XSD that Jenkins and most CI
    servers read (tests/data/junit-10.xsd)."""
    objectives = result.slo
    counts = {"tests": str(len(objectives)), "failures": str(sum(o["passed"] is False for o in objectives)),
              "errors": "0"}
    window = f"{result.window_s:.3f}"
    suite = ET.Element("testsuite", name=f"loadgen.{name}", **counts,
                       skipped=str(sum(o["passed"] is None for o in objectives)), time=window)
    if result.started_at:
        suite.set("timestamp", str(result.started_at))
    props = ET.SubElement(suite, "properties")
    for key, value in _junit_properties(result).items():
        ET.SubElement(props, "property", name=key, value=str(value))
    for o in objectives:
        case = ET.SubElement(suite, "testcase", classname=f"loadgen.{name}.slo", name=o["objective"], time="0")
        detail = (f"{o['objective']} = {fmt(o['value'])}, threshold {o['comparison']} {fmt(o['threshold'])}, "
                  f"{o['samples']} samples" + _junit_interval(dict(o)))
        if o["passed"] is False:
            ET.SubElement(case, "failure", message=detail, type="SLOViolation").text = detail
        elif o["passed"] is None:
            ET.SubElement(case, "skipped", message=f"inconclusive: {o['note']}")
    out_lines = [f"verdict: {result.verdict}", *result.reasons, result.stall_headline]
    ET.SubElement(suite, "system-out").text = "\n".join(line for line in out_lines if line)
    root = ET.Element("testsuites", name="loadgen", time=window, **counts)
    root.append(suite)
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8")


def _transient_words(result: RunResult) -> str:
    """', 12 cut as transient by steady-state detection (from 3.3 s)' where detection cut any."""
    st = result.steady_state or {}
    cut = st.get("transient_requests") or 0
    if not cut:
        return ""
    start = f" (window from {st['start_s']:.1f} s)" if st.get("start_s") is not None else ""
    return f"; {cut} cut as warm-up or drain transients by steady-state detection{start}"


def _junit_interval(o: dict[str, Any]) -> str:
    if o.get("basis") is None:  # a summary written before intervals
        return ""
    if o["basis"] != "interval" or o.get("confidence") is None:
        return ", decided on what was observed" if o["basis"] == "observed" else ", decided on its point value"
    return f", {100 * o['confidence']:g}% interval {interval_words(o)}, margin {margin_words(o)}"


def _junit_properties(result: RunResult) -> dict[str, Any]:
    req, target = result.requests, result.target or {}
    props = {"verdict": result.verdict, "requests.completed": req["completed"], "requests.failed": req["failed"],
             "target.model": target.get("model"), "target.base_url": target.get("base_url"),
             "seed": result.seed, "loadgen.version": result.loadgen_version,
             "decision.rule": (result.decision or {}).get("rule"),
             "decision.confidence": (result.decision or {}).get("confidence")}
    misses = misses_of(result) or {}
    props["misses.requests"] = misses.get("requests")
    props["misses.top_causes"] = ", ".join(misses["top"]) if misses.get("top") else None
    return {k: v for k, v in props.items() if v is not None}


def stalls_markdown(result: RunResult) -> list[str]:
    st = result.stalls
    if not st:
        return []
    lift = f" ({LIFT_WORDS})" if "lift ×" in result.stall_headline else ""
    lines = ["### Tail spikes", "", md_escape(result.stall_headline + lift), "",
             f"Stalls: {st['count']} ({st['per_1k_tokens']:.2f} per 1k tokens), prefill-induced "
             f"{st['prefill_induced']} ({st['prefill_induced_per_1k_tokens']:.2f} per 1k tokens); "
             f"spike events {st['events']}; tail gaps (>= p99) prefill-induced: "
             f"{fmt(st['tail_prefill_induced_share'])}; stall threshold "
             f"max({st['spike_factor']:g} × baseline, {st['min_gap_ms']:g} ms); long prompt >= "
             f"{st['long_prompt_tokens']} tokens.", ""]
    if st.get("worst_events"):
        lines += ["| at (s) | victims | worst gap (ms) | cause | culprits (prompt tokens) |",
                  "| ---: | ---: | ---: | --- | --- |"]
        for e in st["worst_events"]:
            culprits = culprit_words(e["culprits"], st)
            lines.append(f"| {e['at_s']:.1f} | {e['victims']} | {e['max_gap_ms']:.0f} | {e['cause']} | {culprits} |")
        lines.append("")
    return lines


def culprit_words(culprits: list[dict[str, Any]], st: Mapping[str, Any]) -> str:
    """'#12 (3800), #40 session 3 call 9 (12000)': an event's culprits with their prompt tokens (as prefilled),
    a session's call named as such (``top_culprits``' labels)."""
    labels = {c["seq"]: f" {c['label']}" for c in st.get("top_culprits") or [] if c.get("label")}
    return ", ".join(f"#{c['seq']}{labels.get(c['seq'], '')} ({c['prompt_tokens']})" for c in culprits) or "–"


def write_all(run_dir: Path, result: RunResult, name: str, tables: dict[str, Any] | None = None,
              images: list[tuple[str, str]] | None = None) -> None:
    for table, frame in (tables or {}).items():
        frame.write_parquet(run_dir / f"{table}.parquet")
    write_text(run_dir / "summary.json", json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    write_text(run_dir / "summary.md", summary_markdown(result, name, images))
    write_bytes(run_dir / "junit.xml", junit_xml(result, name))
