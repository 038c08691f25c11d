"""The console tables and lines printed after a run (rich), fitted to the console's width (report/fit.py)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from loadgen.core.vocabulary import ObjectiveId
from loadgen.core.vocabulary import METRICS
from loadgen.core.engines import RECOGNISED
from loadgen.plan.prompt_model import ALL_MATCHED
from loadgen.report.writers import COLS, fmt, rows_of
from loadgen.report.wording import decision_words, interval_words, margin_words, value_words
from loadgen.analysis.figures import result_line
from loadgen.analysis.result import RunResult
from loadgen.report.conversation_report import print_conversations
from loadgen.report.misses_report import console_lines as miss_lines
from loadgen.report.session_report import print_sessions
from loadgen.report.fit import fit, print_legend
from loadgen.report.wording import stall_lines, throughput_words

KEYS = ("metric", "objective", "result")  # the cells a narrow console never cuts (report/fit.py)
STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}


def compact(value: Any) -> str:
    """Numbers that fit an 80-column table: whole from 100 up, one decimal from 10, two below."""
    if not isinstance(value, float):
        return fmt(value)
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def metric_table(result: RunResult) -> Table:
    rows = rows_of(result)
    units = {METRICS[r].unit for r in rows}
    title = "latency (ms)" if units == {"ms"} else "metrics (ms; *_tokens rows in tokens)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("metric", no_wrap=True)
    for c in COLS:
        table.add_column(c, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row, *(compact(result.metrics[row][c]) for c in COLS))
    return table


def slo_table(result: RunResult) -> Table:
    words = decision_words(result, short=True)
    slo = Table(title="SLOs" + (f" ({words})" if words else ""), title_justify="left", box=box.SIMPLE_HEAD,
                pad_edge=False)
    for col in ("objective", "value", "interval", "limit", "margin", "result"):
        slo.add_column(col, justify="left" if col in ("objective", "result") else "right", no_wrap=True)
    for o in result.slo:  # the samples are in summary.md; an inconclusive one's reason says how many
        state = {True: "[green]pass", False: "[red]FAIL", None: "[yellow]inconclusive"}[o["passed"]]
        slo.add_row(o["objective"], value_words(dict(o), compact), interval_words(dict(o)),
                    f"{o['comparison']} {fmt(o['threshold'])}", margin_words(dict(o)), state)
    return slo


def print_summary(console: Console, result: RunResult, run_dir: str) -> None:
    console.print(fit(console, metric_table(result), KEYS))
    print_legend(console, rows_of(result))
    if result.slo:
        console.print(fit(console, slo_table(result), KEYS))
    print_conversations(console, result)
    print_sessions(console, result)
    req = result.requests
    console.print(f"{req['completed']} completed, {req['failed']} failed, {req['cancelled']} cancelled",
                  highlight=False)
    console.print(throughput_words(result), highlight=False, markup=False)
    quoted = result_line(result, asked_only=True)
    if quoted:  # cost, energy (where declared), MLPerf conventions (analysis/figures.py)
        console.print(quoted, highlight=False, markup=False)
    steady = result.steady_state or {}
    if steady.get("transient_requests"):
        console.print(f"steady state: {steady['warmup_requests']} warm-up and {steady['drain_requests']} drain "
                      f"request(s) cut by MSER-5 (figures from {steady.get('start_s') or 0:.1f} s)", highlight=False)
    for line in stall_lines(result):
        console.print(line, highlight=False, markup=False)
    for note in result.notes:
        if worth_a_line(note):
            console.print(f"note: {note}", highlight=False, markup=False)
    for found in result.findings:  # what limits the measurement (loadgen check's signs, in the run's records)
        console.print(f"finding: {found['summary']}", style="yellow", highlight=False, markup=False)
    print_verdict(console, result, run_dir)


ROUTINE_NOTES = (RECOGNISED, ALL_MATCHED)  # the engine loadgen recognised; prompt estimates that all matched


def worth_a_line(note: str) -> bool:
    """Whether a run note is said on the console: routine ones (a known engine and what its adapter gives, prompt
    lengths whose estimates all matched the target's count) are kept in summary.md and report.html only."""
    return not any(mark in note for mark in ROUTINE_NOTES)


def print_verdict(console: Console, result: RunResult, run_dir: str) -> None:
    verdict = result.verdict
    console.print(f"verdict: [{STYLE[verdict]}]{verdict.upper()}[/]  ({run_dir})", highlight=False)
    for reason in result.reasons:
        console.print(f"  - {reason}", highlight=False, markup=False)
    for line in miss_lines(result):  # why requests missed: the ledger's top causes (docs/causes.md)
        console.print(line, highlight=False, markup=False)
    if stall_objective_failed(result):
        console.print(f"hint: a stall objective failed: `loadgen advise {run_dir}` replays this run under other "
                      "server settings (chunked prefill, token budget) and says which would meet it",
                      highlight=False, markup=False)

STALL_OBJECTIVES = {ObjectiveId("itl_ms", "max_per_request")}  # besides every objective on stalls or fluidity


def stall_objective_failed(result: RunResult) -> bool:
    """Whether an objective on stalls (rates, worst gap per request, fluidity) failed: ``advise`` can help."""
    return any(o["passed"] is False and (ObjectiveId.of(o).metric in ("stalls", "fluidity")
                                         or ObjectiveId.of(o) in STALL_OBJECTIVES) for o in result.slo)
