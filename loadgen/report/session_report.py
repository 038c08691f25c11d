"""Views of a run's reasoning and agentic-session figures (``RunResult.reasoning``, ``RunResult.sessions``):
summary.md's sections, the console's tables and report.html's sections.

Reasoning: the reasoning share of output tokens, the token counts, and per class TTFT (the first generated
token of any kind — reasoning included, as MLPerf LoadGen counts a reasoning fragment as the first token)
beside the time to first answer token, and how many requests reasoned without ever answering (left out of the
answer percentiles). Tool calls: how many requests called tools, the calls and their tokens, in any run that
has them (with or without reasoning or sessions). Sessions: how many, how many completed, jobs per hour, attainment,
session and agent-step latency, the prefix-cache hit ratio per session and the tool waits. Each part appears
only in a run that has it.
"""

from __future__ import annotations

import html
from typing import Any, Callable

from rich import box
from rich.console import Console
from rich.table import Table

from loadgen.analysis.result import RunResult
from loadgen.report.fit import fit
from loadgen.report.wording import fmt

TTFT_DEFINITION = ("TTFT is the first generated token of any kind (reasoning, tool call or answer), as MLPerf "
                   "LoadGen counts a reasoning fragment as the first token; answer: the time to the first answer "
                   "token, the first that is not reasoning (answer text or a tool call).")
REASONING_HEAD = ("class", "reasoned", "share", "ttft p50", "ttft p99", "answer p50", "answer p99")  # answer:
# time to first answer token
SESSION_HEAD = ("figure", "count", "mean", "p50", "p90", "p99", "max")
SESSION_ROWS = {"session_ms": "session (ms)", "agent_step_ms": "agent step (ms)",
                "cache_hit_ratio": "cache hit per session", "tool_waits.wait_ms": "tool wait (ms)"}


def _reasoning(result: RunResult) -> dict[str, Any] | None:
    return dict(result.reasoning) if result.reasoning else None


def _tools(result: RunResult) -> dict[str, Any] | None:
    return dict(result.tools) if result.tools else None


def _sessions(result: RunResult) -> dict[str, Any] | None:
    return dict(result.sessions) if result.sessions else None


def _share(value: Any) -> str:
    return "–" if value is None else f"{value:.0%}"


def _stat(metrics: dict[str, Any] | None, name: str, stat: str) -> str:
    row = (metrics or {}).get(name) or {}
    return fmt(row.get(stat))


def reasoning_headline(result: RunResult) -> str:
    r = _reasoning(result)
    if not r:
        return ""
    tools = (f"; {r['tool_calls']} tool calls ({r.get('tool_tokens', 0)} tokens)" if r.get("tool_calls") else "")
    unanswered = r.get("requests_without_answer") or 0
    silent = (f" {unanswered} of them never produced an answer token (e.g. reasoned until max_tokens): left out of "
              "the answer percentiles, a miss for a ttft_answer_ms objective." if unanswered else "")
    return (f"Reasoning: {_share(r.get('reasoning_share'))} of output tokens ({r.get('reasoning_tokens')} reasoning, "
            f"{r.get('answer_tokens')} answer{tools}); {r.get('requests_with_reasoning')} of "
            f"{fmt(r.get('requests'))} successful requests reasoned.{silent}")


def tools_headline(result: RunResult) -> str:
    t = _tools(result)
    if not t:
        return ""
    return (f"Tool calls: {t.get('tool_calls')} calls ({t.get('tool_tokens')} tokens, counted as output) in "
            f"{t.get('requests_with_tool_calls')} successful requests.")


def reasoning_rows(result: RunResult) -> list[list[str]]:
    """One row per class that reasoned or answered (and ``all``): TTFT beside time to first answer."""
    r = _reasoning(result) or {}
    per_class = r.get("classes") or {}
    rows = []
    for name, counts in per_class.items():
        metrics = (result.classes.get(name) or {}).get("metrics")
        rows.append([name, f"{counts.get('requests_with_reasoning')}/{counts.get('requests')}",
                     _share(counts.get("reasoning_share")), _stat(metrics, "ttft_ms", "p50"),
                     _stat(metrics, "ttft_ms", "p99"), _stat(metrics, "ttft_answer_ms", "p50"),
                     _stat(metrics, "ttft_answer_ms", "p99")])
    rows.append(["all", f"{r.get('requests_with_reasoning')}/{fmt(r.get('requests'))}",
                 _share(r.get("reasoning_share")), _stat(result.metrics, "ttft_ms", "p50"),
                 _stat(result.metrics, "ttft_ms", "p99"), _stat(result.metrics, "ttft_answer_ms", "p50"),
                 _stat(result.metrics, "ttft_answer_ms", "p99")])
    return rows


def sessions_headline(result: RunResult) -> str:
    s = _sessions(result)
    if not s:
        return ""
    parts = [f"Sessions: {s.get('count')} ({s.get('completed')} completed with every call successful, "
             f"{s.get('failed', 0)} failed"]
    if s.get("cut_at_end"):
        parts.append(f"; {s['cut_at_end']} more cut short by the run's end, not judged")
    parts.append(f"); {fmt(s.get('calls_mean'), 3)} calls and {fmt(s.get('agents_mean'), 3)} agents per session")
    if s.get("jobs_per_hour") is not None:
        parts.append(f"; {fmt(s['jobs_per_hour'])} jobs per hour")
    if s.get("attainment") is not None:
        parts.append(f"; attainment {_share(s['attainment'])} (sessions good by slo.sessions.good)")
    waits = s.get("tool_waits") or {}
    if waits.get("count"):
        parts.append(f"; {waits['count']} tool waits, median {fmt((waits.get('wait_ms') or {}).get('p50'))} ms")
    if s.get("tool_calls"):
        parts.append(f"; {s['tool_calls']} tool calls")
    if s.get("tool_calls_missing"):
        n = s['tool_calls_missing']
        parts.append(f", {n} tool turn{'' if n == 1 else 's'} answered with text instead")
    return "".join(parts) + "."


def sessions_rows(result: RunResult) -> list[list[str]]:
    """Session latency, agent-step latency, the cache-hit ratio per session and tool waits, as statistics."""
    s = _sessions(result) or {}
    rows = []
    for key, label in SESSION_ROWS.items():
        head, _, tail = key.partition(".")
        stats = (s.get(head) or {}).get(tail) if tail else s.get(head)
        if not isinstance(stats, dict):
            continue
        share = key == "cache_hit_ratio"
        rows.append([label] + [(_share(stats.get(c)) if share and c != "count" else fmt(stats.get(c)))
                               for c in SESSION_HEAD[1:]])
    return rows


def sessions_markdown(result: RunResult, escape: Callable[[str], str]) -> list[str]:
    """The Reasoning and Sessions sections of summary.md; ``escape`` makes a class name inert in Markdown."""
    lines: list[str] = []
    if _reasoning(result):
        lines += ["### Reasoning", "", reasoning_headline(result), "", TTFT_DEFINITION + " Times in ms.", "",
                  "| " + " | ".join(REASONING_HEAD) + " |", "| --- |" + " ---: |" * (len(REASONING_HEAD) - 1)]
        lines += ["| " + " | ".join([escape(r[0]), *r[1:]]) + " |" for r in reasoning_rows(result)] + [""]
    if _tools(result):
        lines += ["### Tool calls", "", tools_headline(result), ""]
    if _sessions(result):
        lines += ["### Sessions", "", sessions_headline(result), "",
                  "| " + " | ".join(SESSION_HEAD) + " |", "| --- |" + " ---: |" * (len(SESSION_HEAD) - 1)]
        lines += ["| " + " | ".join(r) + " |" for r in sessions_rows(result)] + [""]
    return lines


def _table(title: str, head: tuple[str, ...], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(head):
        table.add_column(col, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def print_sessions(console: Console, result: RunResult) -> None:
    if _reasoning(result):
        console.print(fit(console, _table("reasoning (ms): TTFT counts thinking, answer does not",
                                          REASONING_HEAD, _compact(reasoning_rows(result))), REASONING_HEAD[:1]))
        console.print(reasoning_headline(result), highlight=False, markup=False)
    if _tools(result):
        console.print(tools_headline(result), highlight=False, markup=False)
    if _sessions(result):
        console.print(fit(console, _table("sessions", SESSION_HEAD, _compact(sessions_rows(result))), SESSION_HEAD[:1]))
        console.print(sessions_headline(result), highlight=False, markup=False)


def _compact(rows: list[list[str]]) -> list[list[str]]:
    """Numbers that fit an 80-column console: whole from 100 up (the summary keeps four digits)."""
    def short(cell: str) -> str:
        try:
            value = float(cell)
        except ValueError:
            return cell
        return f"{value:.0f}" if abs(value) >= 100 else cell
    return [[row[0], *(short(c) for c in row[1:])] for row in rows]


def _html_table(head: tuple[str, ...], rows: list[list[str]]) -> str:
    top = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table>{top}{body}</table>"


def sessions_html(result: RunResult) -> str:
    out = ""
    if _reasoning(result):
        out += (f"<section id=\"reasoning\"><h2>Reasoning</h2><p>{html.escape(reasoning_headline(result))}</p>"
                f"<p class=\"note\">{html.escape(TTFT_DEFINITION)} Times in ms.</p>"
                + _html_table(REASONING_HEAD, reasoning_rows(result)) + "</section>")
    if _tools(result):
        out += f"<section id=\"tools\"><h2>Tool calls</h2><p>{html.escape(tools_headline(result))}</p></section>"
    if _sessions(result):
        out += (f"<section id=\"sessions\"><h2>Sessions</h2><p>{html.escape(sessions_headline(result))}</p>"
                + _html_table(SESSION_HEAD, sessions_rows(result))
                + "<p class=\"note\">The session lane below draws the slowest session call by call.</p></section>")
    return out
