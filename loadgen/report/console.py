"""The console table printed after a run (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .writers import COLS, ROWS, fmt

STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}


def print_summary(console: Console, summary: dict[str, Any], run_dir: str) -> None:
    table = Table(title="latency (ms)", title_justify="left")
    table.add_column("metric", no_wrap=True, min_width=15)
    for c in COLS:
        table.add_column(c, justify="right")
    for row in ROWS:
        table.add_row(row, *(fmt(summary["metrics"][row][c]) for c in COLS))
    console.print(table)
    if summary["slo"]:
        slo = Table(title="SLOs", title_justify="left")
        for col in ("objective", "value", "threshold", "samples", "result"):
            slo.add_column(col, justify="left" if col in ("objective", "result") else "right")
        for o in summary["slo"]:
            result = {True: "[green]pass", False: "[red]FAIL", None: "[yellow]inconclusive"}[o["passed"]]
            slo.add_row(o["objective"], fmt(o["value"]), f"{o['comparison']} {fmt(o['threshold'])}",
                        str(o["samples"]), result)
        console.print(slo)
    req, tput = summary["requests"], summary["throughput"]
    console.print(f"{req['completed']} completed, {req['failed']} failed, {req['cancelled']} cancelled; "
                  f"{tput['requests_per_s']:.2f} req/s, {tput['output_tokens_per_s']:.0f} tok/s, "
                  f"goodput {tput['goodput_requests_per_s']:.2f} req/s")
    verdict = summary["verdict"]
    console.print(f"verdict: [{STYLE[verdict]}]{verdict.upper()}[/]  ({run_dir})", highlight=False)
    for reason in summary.get("reasons", []):
        console.print(f"  - {reason}", highlight=False, markup=False)
