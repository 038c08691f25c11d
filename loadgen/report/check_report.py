"""``loadgen check``'s console view: one row per check (a mark, the line's name, its summary; with ``--verbose``
the evidence under it), wrapped at the console's width, then the verdict. ``--json`` is ``CheckResult.to_json()``."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from loadgen.analysis.check_result import CheckResult

MARKS = {"ok": "[green]✓[/]", "info": "[cyan]i[/]", "finding": "[yellow]![/]", "fail": "[red]✗[/]"}
VERDICT_STYLE = {"clean": "green", "findings": "yellow", "cannot measure": "red"}


def evidence_text(evidence: dict[str, Any]) -> str:
    """``key=value`` pairs, skipping what is unknown; lists and mappings as compact JSON."""
    parts = []
    for key, value in evidence.items():
        if value is None or key == "tries":
            continue
        shown = json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict)) else value
        parts.append(f"{key}={shown}")
    return ", ".join(parts)


def print_check(console: Console, result: CheckResult, verbose: bool = False) -> None:
    """The header, one row per check (its summary wrapped in its own column, the evidence under it with
    ``verbose``), the verdict; no line wider than the console."""
    t = result.target
    engine = f", {t['engine']}" if t.get("engine") else ""
    console.print(f"loadgen check: {escape(str(t['base_url']))} — model {escape(str(t['model']))} ({t['api']}"
                  f"{engine}); {result.requests} requests in {result.elapsed_s:.1f} s", highlight=False)
    console.print(findings_grid(result, verbose))
    limits = result.limits()
    style = VERDICT_STYLE.get(result.verdict, "white")
    said = {"clean": "clean: nothing here limits what a run measures",
            "findings": f"{len(limits)} finding(s) limit what can be measured here: {', '.join(limits)}",
            "cannot measure": f"cannot be measured: {', '.join(limits)}"}[result.verdict]
    if result.verdict != "clean" and not verbose:
        console.print("[dim]each line's evidence: add --verbose (all of it: --json)[/]", highlight=False)
    console.print(f"[bold {style}]verdict:[/] {escape(said)} (exit {result.exit_code})", highlight=False)


def findings_grid(result: CheckResult, verbose: bool) -> Table:
    """Mark, name and summary per check; the summary (and, ``verbose``, the evidence row under it) wraps in its
    column, so the marks and names stay one column a user scans down."""
    grid = Table.grid(padding=(0, 1), pad_edge=False)
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for f in result.findings:
        grid.add_row(Text.from_markup(" " + MARKS[f.status]), Text(f.name + " "), Text(f.summary))
        evidence = evidence_text(f.evidence) if verbose else ""
        if evidence:
            grid.add_row("", "", Text(evidence, style="dim"))
    return grid
