"""``loadgen check``'s console view: one line per check (a mark, the line's name, its summary and evidence),
then the verdict. ``--json`` is ``CheckResult.to_json()``."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

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


def print_check(console: Console, result: CheckResult) -> None:
    t = result.target
    engine = f", {t['engine']}" if t.get("engine") else ""
    console.print(f"loadgen check: {escape(str(t['base_url']))} — model {escape(str(t['model']))} ({t['api']}"
                  f"{engine}); {result.requests} requests in {result.elapsed_s:.1f} s", highlight=False,
                  soft_wrap=True)
    width = max(len(f.name) for f in result.findings) if result.findings else 0
    for f in result.findings:
        evidence = evidence_text(f.evidence)
        tail = f"  [dim]{escape(evidence)}[/]" if evidence else ""
        console.print(f" {MARKS[f.status]} {f.name:<{width}}  {escape(f.summary)}{tail}", highlight=False,
                      soft_wrap=True)
    limits = result.limits()
    style = VERDICT_STYLE.get(result.verdict, "white")
    said = {"clean": "clean: nothing here limits what a run measures",
            "findings": f"{len(limits)} finding(s) limit what can be measured here: {', '.join(limits)}",
            "cannot measure": f"cannot be measured: {', '.join(limits)}"}[result.verdict]
    console.print(f"[bold {style}]verdict:[/] {escape(said)} (exit {result.exit_code})", highlight=False,
                  soft_wrap=True)
