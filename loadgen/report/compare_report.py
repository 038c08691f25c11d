"""Views of a comparison: compare.md, compare.json and the console table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from loadgen.analysis.compare import MetricComparison
from loadgen.core.secrets import write_text
from loadgen.report.console import compact
from loadgen.report.writers import fmt, md_escape

STATUS_STYLE = {"regressed": "bold red", "improved": "green", "unchanged": "", "uncertain": "yellow",
                "no data": "dim"}


def signed_change(c: MetricComparison, worsening: float) -> float:
    """A worsening (positive = worse) as the metric's own signed change."""
    return worsening if c.spec.better == "lower" else -worsening


def _pct(c: MetricComparison, change: float) -> str:
    if c.spec.change == "relative":
        return f"{change * 100:+.1f}%"
    return f"{change * 100:+.2f}pp" if c.metric == "error_rate" else f"{change:+.2f}"


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


def comparison_dict(results: list[MetricComparison], base: str, new: str, meta: dict[str, Any]) -> dict[str, Any]:
    regressed = [c.metric for c in results if c.status == "regressed"]
    return {"base": base, "new": new, "verdict": "regressed" if regressed else "ok", "regressed": regressed,
            **meta, "metrics": [c.as_dict() for c in results]}


def _code(text: str) -> str:
    """A Markdown code span: nothing inside is interpreted, so only backticks need care."""
    return "`" + text.replace("`", "'") + "`"


def compare_markdown(doc: dict[str, Any], results: list[MetricComparison]) -> str:
    head = "❌ REGRESSED: " + ", ".join(f"`{m}`" for m in doc["regressed"]) if doc["regressed"] else "✅ no regression"
    lines = [f"## loadgen compare — {head}", "",
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
    return "\n".join(lines) + "\n"


def print_comparison(console: Console, doc: dict[str, Any], results: list[MetricComparison]) -> None:
    table = Table(title=f"{doc['base']} → {doc['new']}", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("metric", "base", "new", "change", f"{doc['confidence'] * 100:g}% CI", "status"):
        table.add_column(name, justify="left" if name in ("metric", "status") else "right", no_wrap=True)
    for c in results:
        table.add_row(c.metric, compact(c.base), compact(c.new), change_text(c, c.worsening), ci_text(c),
                      f"[{STATUS_STYLE[c.status]}]{c.status}[/]" if STATUS_STYLE[c.status] else c.status)
    console.print(table)
    for w in doc.get("warnings", []):
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    verdict = (f"[bold red]REGRESSED[/]: {', '.join(doc['regressed'])}" if doc["regressed"]
               else "[bold green]no regression[/]")
    console.print(f"verdict: {verdict}", highlight=False)


def write_comparison(out_dir: Path, doc: dict[str, Any], results: list[MetricComparison]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "compare.json", json.dumps(doc, indent=2) + "\n")
    write_text(out_dir / "compare.md", compare_markdown(doc, results))
