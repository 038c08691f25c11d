"""Views of a comparison: compare.json, compare.md, compare.html, compare-junit.xml and the console table. Each
says the verdict change first (base verdict → new verdict, and which objectives changed decision), then the
metrics."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loadgen.analysis.compare import MetricComparison
from loadgen.analysis.compare_basis import change_line
from loadgen.core.secrets import write_bytes, write_text
from loadgen.report.console import compact
from loadgen.report.fit import fit, print_legend
from loadgen.report.html import e, page
from loadgen.report.writers import fmt, md_escape

STATUS_STYLE = {"regressed": "bold red", "improved": "green", "unchanged": "", "uncertain": "yellow",
                "no data": "dim"}


def signed_change(c: MetricComparison, worsening: float) -> float:
    """A worsening (positive = worse) as the metric's own signed change."""
    return worsening if c.spec.better == "lower" else -worsening


def _pct(c: MetricComparison, change: float) -> str:
    if c.spec.change == "relative":
        return f"{change * 100:+.1f}%"
    return f"{change * 100:+.2f}pp" if c.metric == "error_rate" else f"{change:+.3g}"


def change_text(c: MetricComparison, worsening: float | None) -> str:
    """+12.3% (relative change) or +0.50 pp (the error rate's absolute change)."""
    return "–" if worsening is None else _pct(c, signed_change(c, worsening))


def ci_text(c: MetricComparison) -> str:
    if c.ci_low is None or c.ci_high is None:
        return "–"
    lo, hi = sorted((signed_change(c, c.ci_low), signed_change(c, c.ci_high)))
    return f"[{_pct(c, lo)},{_pct(c, hi)}]"


def threshold_text(c: MetricComparison) -> str:
    worse = "+" if c.spec.better == "lower" else "−"
    return worse + _pct(c, c.threshold).lstrip("+")


def comparison_dict(change: dict[str, Any], results: list[MetricComparison], base: str, new: str,
                    meta: dict[str, Any]) -> dict[str, Any]:
    """compare.json: the verdict change first, then the outcome (exit code 1 when a metric regressed or the
    verdict got worse), then the metrics."""
    regressed = [c.metric for c in results if c.status == "regressed"]
    failed = bool(regressed) or bool(change["worse"])
    return {"verdict_change": change, "base": base, "new": new,
            "verdict": "regressed" if regressed else "worse verdict" if change["worse"] else "ok",
            "regressed": regressed, "exit_code": 1 if failed else 0, **meta,
            "metrics": [c.as_dict() for c in results]}


def _objective_rows(doc: dict[str, Any]) -> list[list[str]]:
    return [[o["objective"], o["base"], o["new"], fmt(o["base_value"]), fmt(o["new_value"]),
             f"{o['comparison']} {fmt(o['new_threshold'] if o['new_threshold'] is not None else o['base_threshold'])}"]
            for o in doc["verdict_change"]["objectives"] if o["changed"]]


OBJECTIVE_HEAD = ["objective", "base decision", "new decision", "base value", "new value", "limit"]


MISS_HEAD = ["cause", "missed", "change", "share of misses", "goodput lost"]  # each base → new


def miss_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Per cause (compare_basis.miss_change): requests missed, share of misses and goodput lost, base → new."""
    rows = []
    for r in (doc.get("misses") or {}).get("causes", []):
        share = " → ".join("–" if x is None else f"{100 * x:.0f}%" for x in (r["base_share"], r["new_share"]))
        rows.append([r["cause"], f"{r['base_requests']:,} → {r['new_requests']:,}", f"{r['delta_requests']:+,}",
                     share, f"{r['base_goodput_lost']:,} → {r['new_goodput_lost']:,}"])
    return rows


def miss_line(doc: dict[str, Any]) -> str:
    """'misses: 42 of 1,200 → 12 of 1,180 (−30); by cause, base → new (docs/causes.md):' (the table follows),
    'misses: none in either run (0 of 1,200 → 0 of 1,180)', or which run has no ledger (written before it; no
    cause is compared); empty for a compare.json written before the ledger."""
    m = doc.get("misses")
    if not m:
        return ""
    lacking = [side for side in ("base", "new") if not m["ledger"][side]]
    if lacking:
        return (f"misses by cause: no ledger in the {' and '.join(lacking)} run's summary (written before it, or a "
                "repeat's): no cause compared")
    b, n = m["base"], m["new"]
    if not (b["requests"] or n["requests"]):
        return f"misses: none in either run (0 of {b['of']:,} → 0 of {n['of']:,})"
    by_cause = "; by cause, base → new (docs/causes.md):" if miss_rows(doc) else ""
    return (f"misses: {b['requests']:,} of {b['of']:,}{_share(b)} → {n['requests']:,} of {n['of']:,}{_share(n)} "
            f"({m['delta_requests']:+,}){by_cause}")


def _share(side: dict[str, Any]) -> str:
    return "" if side.get("share") is None else f" ({100 * side['share']:.1f}%)"


def _code(text: str) -> str:
    """A Markdown code span: nothing inside is interpreted, so only backticks need care."""
    return "`" + text.replace("`", "'") + "`"


def compare_markdown(doc: dict[str, Any], results: list[MetricComparison]) -> str:
    head = "❌ REGRESSED: " + ", ".join(f"`{m}`" for m in doc["regressed"]) if doc["regressed"] else "✅ no regression"
    change = doc["verdict_change"]
    mark = "❌" if change["worse"] else "⚠️" if change["changed"] else "✅"
    lines = [f"## loadgen compare — {mark} {md_escape(change_line(change))}", ""]
    rows = _objective_rows(doc)
    if rows:
        lines += ["| " + " | ".join(OBJECTIVE_HEAD) + " |", "|" + " --- |" * len(OBJECTIVE_HEAD)]
        lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows] + [""]
    lines += [f"### metrics — {head} (exit {doc['exit_code']})", "",
             f"Base {_code(doc['base'])} → new {_code(doc['new'])}; {doc['confidence'] * 100:g}% "
             f"bootstrap confidence intervals ({doc['replicates']} replicates, resampling requests"
             f"{', paired by plan sequence number' if doc.get('paired') else ''}).", ""]
    lines += [f"- {md_escape(w)}" for w in doc.get("warnings", [])]
    lines += ["", "| metric | base | new | change | CI | regression if | status |",
              "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for c in results:
        status = f"**{c.status}**" if c.status == "regressed" else c.status
        lines.append(f"| `{c.metric}` | {fmt(c.base)} | {fmt(c.new)} | {change_text(c, c.worsening)} | {ci_text(c)} "
                     f"| CI beyond {threshold_text(c)} | {status} |")
    if miss_line(doc):
        lines += ["", "### Why requests missed", "", md_escape(miss_line(doc)), ""]
        if miss_rows(doc):
            lines += ["| " + " | ".join(MISS_HEAD) + " |", "| --- |" + " ---: |" * (len(MISS_HEAD) - 1)]
            lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in miss_rows(doc)]
    return "\n".join(lines) + "\n"


def print_comparison(console: Console, doc: dict[str, Any], results: list[MetricComparison]) -> None:
    for w in doc.get("warnings", []):  # first: what the results below must be read with (different scenarios)
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    change = doc["verdict_change"]
    style = "bold red" if change["worse"] else "yellow" if change["changed"] else "green"
    console.print(f"[{style}]{change_line(change)}[/]", highlight=False)
    table = Table(title=f"{doc['base']} → {doc['new']}", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("metric", "base", "new", "change", f"{doc['confidence'] * 100:g}% CI", "status"):
        table.add_column(name, justify="left" if name in ("metric", "status") else "right", no_wrap=True)
    for c in results:
        table.add_row(c.metric, compact(c.base), compact(c.new), change_text(c, c.worsening), ci_text(c),
                      f"[{STATUS_STYLE[c.status]}]{c.status}[/]" if STATUS_STYLE[c.status] else c.status)
    console.print(fit(console, table, ("metric", "change", "status")))
    print_legend(console, [c.metric.split(".")[0] for c in results])
    print_misses(console, doc)
    verdict = (f"[bold red]REGRESSED[/]: {', '.join(doc['regressed'])}" if doc["regressed"]
               else "[bold green]no regression[/]")
    console.print(f"metrics: {verdict}; exit {doc['exit_code']}", highlight=False)


def print_misses(console: Console, doc: dict[str, Any]) -> None:
    """Per cause, the misses base → new (nothing for a compare.json written before the ledger)."""
    if not miss_line(doc):
        return
    console.print(miss_line(doc), highlight=False, markup=False)
    if not miss_rows(doc):
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in MISS_HEAD:
        table.add_column(name, justify="left" if name == "cause" else "right", no_wrap=True)
    for row in miss_rows(doc):
        table.add_row(*row)
    console.print(fit(console, table, ("cause",)))


def write_comparison(out_dir: Path, doc: dict[str, Any], results: list[MetricComparison]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "compare.json", json.dumps(doc, indent=2) + "\n")
    write_text(out_dir / "compare.md", compare_markdown(doc, results))
    write_text(out_dir / "compare.html", compare_html(doc, results))
    write_bytes(out_dir / "compare-junit.xml", compare_junit(doc, results))


def compare_html(doc: dict[str, Any], results: list[MetricComparison]) -> str:
    change = doc["verdict_change"]
    badge = "fail" if doc["exit_code"] else "pass"
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in _objective_rows(doc))
    objectives = (f"<table id=\"objectives\"><tr>{''.join(f'<th>{h}</th>' for h in OBJECTIVE_HEAD)}</tr>{rows}"
                  "</table>" if rows else "")
    metrics = "".join(f"<tr><td>{e(c.metric)}</td><td>{e(fmt(c.base))}</td><td>{e(fmt(c.new))}</td>"
                      f"<td>{e(change_text(c, c.worsening))}</td><td>{e(ci_text(c))}</td>"
                      f"<td>{e(threshold_text(c))}</td><td class=\"text\">{e(c.status)}</td></tr>" for c in results)
    body = (f"<h1>loadgen compare <span class=\"badge {badge}\" id=\"verdict\">{e(change_line(change))}</span></h1>"
            f"<p class=\"meta\">base {e(doc['base'])} → new {e(doc['new'])}; exit {doc['exit_code']}; "
            f"{doc['confidence'] * 100:g}% bootstrap intervals</p>"
            + "".join(f"<p class=\"meta\">warning: {e(w)}</p>" for w in doc.get("warnings", [])) + objectives
            + "<h2>Metrics</h2><table id=\"metrics\"><tr><th>metric</th><th>base</th><th>new</th><th>change</th>"
            "<th>CI</th><th>regression if beyond</th><th>status</th></tr>" + metrics + "</table>"
            + misses_html(doc))
    return page("loadgen compare", body)


def misses_html(doc: dict[str, Any]) -> str:
    """compare.html's "Why requests missed": the totals, then per cause base → new."""
    if not miss_line(doc):
        return ""
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in miss_rows(doc))
    table = (f"<table id=\"misses\"><tr>{''.join(f'<th>{h}</th>' for h in MISS_HEAD)}</tr>{rows}</table>"
             if rows else "")
    return f"<h2>Why requests missed</h2><p>{e(miss_line(doc))}</p>{table}"


def compare_junit(doc: dict[str, Any], results: list[MetricComparison]) -> bytes:
    """One test case for the verdict change (failure: it got worse), then one per metric (failure: regressed;
    skipped: uncertain or no data)."""
    change = doc["verdict_change"]
    suite = ET.Element("testsuite", name="loadgen.compare", tests=str(len(results) + 1), errors="0",
                       failures=str(int(change["worse"]) + len(doc["regressed"])),
                       skipped=str(sum(c.status in ("uncertain", "no data") for c in results)), time="0")
    case = ET.SubElement(suite, "testcase", classname="loadgen.compare", name="verdict", time="0")
    if change["worse"]:
        ET.SubElement(case, "failure", message=change_line(change), type="VerdictWorse").text = change_line(change)
    for c in results:
        case = ET.SubElement(suite, "testcase", classname="loadgen.compare.metric", name=c.metric, time="0")
        detail = f"{c.metric}: {fmt(c.base)} → {fmt(c.new)}, change {change_text(c, c.worsening)} CI {ci_text(c)}"
        if c.status == "regressed":
            ET.SubElement(case, "failure", message=detail, type="Regression").text = detail
        elif c.status in ("uncertain", "no data"):
            ET.SubElement(case, "skipped", message=f"{c.status}: {detail}")
    ET.SubElement(suite, "system-out").text = change_line(change)
    root = ET.Element("testsuites", name="loadgen", time="0")
    root.append(suite)
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8")
