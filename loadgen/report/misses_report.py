"""Why requests missed: the SLO-miss ledger's views — the console's top-causes lines, summary.md's table and
report.html's section (per-cause table, the limits judged, per class, the worst misses with their evidence and
culprits, and the miss lane). All read ``summary["misses"]`` (analysis/ledger.py's figures) and, for the worst
misses, misses.parquet's rows; a summary written before the ledger has no ``misses`` and gets no section.
docs/causes.md says what each cause means and how one is decided."""

from __future__ import annotations

import html
from typing import Any, Callable

import polars as pl

from loadgen.analysis.result import RunResult
from loadgen.core import vocabulary

TOP_MISSES = 12  # rows of the worst-misses table
UNEXPLAINED = "unknown"  # the cause named "unexplained" in the words: the evidence did not decide
DOCS = "docs/causes.md"


def cause_meanings() -> dict[str, str]:
    """Every cause with what it means, in decision order: core/vocabulary.py's ``CAUSES``."""
    return dict(vocabulary.CAUSES)


def misses_of(result: RunResult) -> dict[str, Any] | None:
    """The run's ``misses`` block (None: a summary written before the ledger)."""
    block = result.misses
    return dict(block) if isinstance(block, dict) and "by_cause" in block else None


def class_misses(result: RunResult) -> dict[str, dict[str, Any]]:
    """Per class, its ``misses`` block; empty in a run of one class (its figures are the run's)."""
    classes = result.classes or {}
    out = {name: dict(c["misses"]) for name, c in classes.items() if isinstance(c.get("misses"), dict)}
    return out if len(classes) > 1 else {}


def causes_in_order(block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(cause, figures) by requests missed, most first, then by name."""
    return sorted(block.get("by_cause", {}).items(), key=lambda kv: (-int(kv[1].get("requests", 0)), kv[0]))


def unexplained(block: dict[str, Any]) -> int:
    return int(block.get("by_cause", {}).get(UNEXPLAINED, {}).get("requests", 0))


def headline(block: dict[str, Any], most: int = 4) -> str:
    """'misses: 42 of 1,200 requests — queueing 30 (goodput lost 28), prefill 9, own_prompt 3; unexplained 0'."""
    n, of = int(block.get("requests", 0)), int(block.get("of", 0))
    if n == 0:
        return f"misses: none of {of:,} requests missed a limit" if of else "misses: no request measured"
    causes = causes_in_order(block)
    parts = [f"{c} {f['requests']:,}" + (f" (goodput lost {lost:,})" if i == 0 and lost else "")  # none lost: said
             for i, (c, f) in enumerate(causes[:most]) for lost in [int(f.get("goodput_lost", 0))]]  # by silence
    rest = causes[most:]
    if rest:
        parts.append(f"{len(rest)} more cause(s) {sum(int(f['requests']) for _, f in rest):,}")
    return f"misses: {n:,} of {of:,} requests — {', '.join(parts)}; unexplained {unexplained(block):,}"


def console_lines(result: RunResult) -> list[str]:
    """The run's headline, then one per class (a run of several classes); none for a summary without the
    ledger, or a run with no limit to judge against."""
    block = misses_of(result)
    if block is None or not (block.get("limits") or block.get("requests")):
        return []
    lines = [headline(block)]
    lines += [f"  {name}: " + headline(b).removeprefix("misses: ") for name, b in class_misses(result).items()]
    return lines


def limits_words(block: dict[str, Any]) -> str:
    """'ttft_ms ≤ 2000 ms, e2e_ms ≤ 20000 ms; every failed request' (the limits the requests were judged by)."""
    limits = block.get("limits") or {}
    parts = [f"{metric} ≤ {_num(limit)} ms" for metric, limit in limits.items()]
    return ", ".join(parts) + ("; " if parts else "") + "every failed request (an error, a timeout)"


def _num(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return f"{int(value):,}"


def _pct(share: Any) -> str:
    return "–" if share is None else f"{100 * float(share):.1f}%"


def total_words(block: dict[str, Any]) -> str:
    """'42 of 1,200 measured requests missed a limit (3.5%); goodput lost 40 (0.67 req/s); unexplained 0.0% of
    misses.'"""
    lost = sum(int(f.get("goodput_lost", 0)) for f in block.get("by_cause", {}).values())
    lost_per_s = sum(float(f.get("goodput_lost_per_s") or 0.0) for f in block.get("by_cause", {}).values())
    return (f"{int(block.get('requests', 0)):,} of {int(block.get('of', 0)):,} measured requests missed a limit "
            f"({_pct(block.get('share'))}); goodput lost {lost:,} ({lost_per_s:.2f} req/s); unexplained "
            f"{_pct(block.get('unexplained_share'))} of misses.")


CAUSE_HEAD = ("cause", "requests", "share of misses", "goodput lost", "goodput lost (req/s)", "what it means")


def cause_rows(block: dict[str, Any]) -> list[tuple[str, ...]]:
    meanings = cause_meanings()
    return [(c, f"{int(f['requests']):,}", _pct(f.get("share")), f"{int(f.get('goodput_lost', 0)):,}",
             f"{float(f.get('goodput_lost_per_s') or 0.0):.2f}", meanings.get(c, ""))
            for c, f in causes_in_order(block)]


CLASS_HEAD = ("class", "missed", "of", "share", "causes")


def class_rows(result: RunResult) -> list[tuple[str, ...]]:
    return [(name, f"{int(b.get('requests', 0)):,}", f"{int(b.get('of', 0)):,}", _pct(b.get("share")),
             ", ".join(f"{c} {int(f['requests']):,}" for c, f in causes_in_order(b)) or "–")
            for name, b in class_misses(result).items()]


def misses_markdown(result: RunResult, escape: Callable[[str], str]) -> list[str]:
    """summary.md's "Why requests missed": the totals, the limits judged, the per-cause table, per class."""
    block = misses_of(result)
    if block is None or not (block.get("limits") or block.get("requests")):
        return []
    lines = ["### Why requests missed", "", escape(total_words(block)), "",
             f"Limits judged: {escape(limits_words(block))} ({DOCS}).", ""]
    if block.get("requests"):
        lines += _md_table(CAUSE_HEAD, cause_rows(block), escape)
    rows = class_rows(result)
    if rows:
        lines += _md_table(CLASS_HEAD, rows, escape)
    return lines


def _md_table(head: tuple[str, ...], rows: list[tuple[str, ...]], escape: Callable[[str], str]) -> list[str]:
    align = " | ".join("---" if i in (0, len(head) - 1) else "---:" for i in range(len(head)))
    return (["| " + " | ".join(head) + " |", f"| {align} |"]
            + ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows] + [""])


# ---- the worst misses (misses.parquet's rows) --------------------------------------------------------
def worst_misses(misses: pl.DataFrame | None, n: int = TOP_MISSES) -> pl.DataFrame:
    """The worst miss of each cause first (most misses' cause first), then the rest by how far over its limit
    (excess / limit; an error, with no excess, after those of its rank)."""
    if misses is None or misses.is_empty():
        return pl.DataFrame()
    over = (pl.col("excess_ms") / pl.col("limit_ms")).fill_nan(None)
    ranked = misses.with_columns(over=over, n_cause=pl.len().over("cause"))
    ranked = ranked.with_columns(rank=pl.col("over").fill_null(float("-inf"))
                             .rank("ordinal", descending=True).over("cause"))
    return ranked.sort(["rank", "n_cause", "over", "cause"], descending=[False, True, True, False],
                       nulls_last=True).head(n)


def culprit_text(culprits: Any) -> str:
    return ", ".join(f"#{c}" for c in (culprits or [])) or "–"


def miss_row(row: dict[str, Any], t0_ns: int) -> tuple[str, ...]:
    """One worst miss as table cells: seq, class, its intended send (s since the run's start), metric, value, limit, cause, evidence, culprits."""
    at_s = (row["t_intended_ns"] - t0_ns) / 1e9 if row.get("t_intended_ns") is not None else None
    value = ("error" if row.get("metric") == "error"
             else "no answer" if row.get("value_ms") is None else _num(row["value_ms"]))
    return (f"#{row['seq']}", str(row.get("class_name") or ""), "–" if at_s is None else f"{at_s:.1f}",
            str(row.get("metric") or ""), value, _num(row.get("limit_ms")), str(row["cause"]),
            str(row.get("evidence") or ""), culprit_text(row.get("culprits")))


MISS_HEAD = ("request", "class", "intended send (s)", "metric", "value (ms)", "limit (ms)", "cause", "evidence", "culprits")


# ---- report.html --------------------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _html_table(table_id: str, head: tuple[str, ...], rows: list[tuple[str, ...]], text_cols: set[int]) -> str:
    cells = "".join(f"<th style=\"text-align:left\">{_e(h)}</th>" if i in text_cols else f"<th>{_e(h)}</th>"
                    for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f"<td class=\"text\">{_e(c)}</td>" if i in text_cols else f"<td>{_e(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table id=\"{table_id}\"><tr>{cells}</tr>{body}</table>"


def misses_html(result: RunResult, misses: pl.DataFrame | None = None, t0_ns: int = 0, lane_html: str = "") -> str:
    """report.html's "Why requests missed" section: the totals and the limits judged, the per-cause table, per
    class, the worst misses with their evidence and culprits (``misses``: misses.parquet's rows; ``t0_ns``: the
    run's time origin), then ``lane_html`` (the miss lane's chart section). Empty without the ledger."""
    block = misses_of(result)
    if block is None or not (block.get("limits") or block.get("requests")):
        return ""
    out = [f"<p>{_e(total_words(block))}</p>",
           f"<p class=\"note\">Limits judged: {_e(limits_words(block))}. Each miss has one cause, decided in "
           f"a fixed order from the evidence shown ({DOCS}).</p>"]
    if block.get("requests"):
        out.append(_html_table("miss-causes", CAUSE_HEAD, cause_rows(block), {0, 5}))
    rows = class_rows(result)
    if rows:
        out.append("<h3>Per class</h3>" + _html_table("miss-classes", CLASS_HEAD, rows, {0, 4}))
    worst = worst_misses(misses)
    if worst.height:
        out.append("<h3>The worst misses</h3>" + _html_table(
            "worst-misses", MISS_HEAD, [miss_row(r, t0_ns) for r in worst.iter_rows(named=True)], {1, 3, 6, 7, 8}))
    return "<section id=\"misses\"><h2>Why requests missed</h2>" + "".join(out) + lane_html + "</section>"
