"""Views of a multi-turn run's figures (``RunResult.conversations``): summary.md's section, the console's table
and report.html's section. One row per turn index: how TTFT moves as the history grows, and how much of each
prompt the server's prefix cache held."""

from __future__ import annotations

import html
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from loadgen.analysis.result import RunResult
from loadgen.report.fit import fit
from loadgen.report.wording import fmt

HEAD = ("turn", "requests", "ok", "ttft p50", "ttft p99", "prompt", "cached", "hit")  # ms; tokens (means)


def _cells(row: dict[str, Any]) -> list[str]:
    hit = row["cache_hit_ratio"]
    return [str(row["turn"]), str(row["requests"]), str(row["ok"]), fmt(row["ttft_ms"]["p50"]),
            fmt(row["ttft_ms"]["p99"]), fmt(row["prompt_tokens_mean"]), fmt(row["cached_tokens_mean"]),
            "—" if hit is None else f"{hit:.0%}"]


def headline(result: RunResult) -> str:
    c = (result.conversations or {}).get("conversations")
    if not c:
        return ""
    d = c["duration_s"]
    return (f"Conversations: {c['count']} ({c['failed']} ended by a failed turn), {c['turns_mean']:.1f} turns on "
            f"average (at most {c['turns_max']}); a whole conversation took {fmt(d['p50'])} s at the median, "
            f"{fmt(d['p99'])} s at p99.")


def conversations_markdown(result: RunResult) -> list[str]:
    if not result.conversations:
        return []
    lines = ["### Conversations", "", headline(result), "", "TTFT in ms; prompt and cached: mean tokens per "
             "request (cached: found in the server's prefix cache).", "",
             "| " + " | ".join(HEAD) + " |", "| --- |" + " ---: |" * (len(HEAD) - 1)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in result.conversations["turns"]]
    return lines + [""]


def print_conversations(console: Console, result: RunResult) -> None:
    if not result.conversations:
        return
    table = Table(title="by turn (TTFT ms; mean prompt and cached tokens)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in HEAD:
        table.add_column(col, justify="right", no_wrap=True)
    for row in result.conversations["turns"]:
        table.add_row(*_cells(row))
    console.print(fit(console, table, HEAD[:1]))
    console.print(headline(result), highlight=False, markup=False)


def conversations_html(result: RunResult) -> str:
    if not result.conversations:
        return ""
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in HEAD) + "</tr>"
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>"
                   for r in result.conversations["turns"])
    return (f"<section id=\"conversations\"><h2>Conversations</h2><p>{html.escape(headline(result))}</p>"
            f"<table>{head}{rows}</table></section>")
