"""Views of an ``Advice``: advice.md, the console's table and report.html's advice section. Text only."""

from __future__ import annotations

import html
from typing import Any, Optional

from rich.table import Table

from loadgen.analysis.advice_result import Advice, CandidateResult, ObjectiveHeadroom
from loadgen.report.advice_words import (candidate_line, headline, least, margin_pct, num, on_run_lines, plural,
                                         recommendation_lines, required_of, rule, shortfalls, stopped_early,
                                         undecided)
from loadgen.report.fit import Fitted

__all__ = ["console_lines", "console_tables", "headline", "html_section", "markdown", "recommendation_lines"]

COLUMNS = ("TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "worst gap")


def _num(value: Optional[float], digits: int = 1) -> str:
    return num(value, digits)


def _pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:+.0%}"


def _mark(c: CandidateResult, chosen: Optional[CandidateResult]) -> str:
    return "→ " if c is chosen else ""


def _outcome(c: CandidateResult) -> str:
    """Whether the candidate holds, as its console sentence says (``candidate_line``): "within every limit" only
    of one that kept the margin in the replays the rule requires, else what missed; without seeded replays, the
    one replay's point values (no margin, no interval)."""
    h = c.headroom
    over = "over: " + ", ".join(c.failed)
    if h is None:
        return "within every limit" if c.meets_all else over
    if h.qualifies:
        return "within every limit" if c.meets_all else f"holds; {over} under the scenario's seed"
    missed = shortfalls(h)
    return "fails: " + (missed or f"held in {h.held} of {h.replays}, {h.required} needed")


def _rule(a: Advice) -> str:
    return rule(a)


def _held(c: CandidateResult) -> str:
    """The replays held of those run, and why they stopped."""
    h = c.headroom
    if h is None:
        return "–"
    return f"held in {h.held} of {h.replays} (" + ("decided early" if stopped_early(h) else "all run") + ")"


def _cell(o: ObjectiveHeadroom, margin: float) -> str:
    ok = "✓" if o.kept is not None and o.kept >= margin - 1e-12 and not o.short else "✗" if o.short else "·"
    return f"{margin_pct(o.kept)} / {margin_pct(o.worst)} {ok}"


def headroom_head(a: Advice) -> list[str]:
    first = next((c.headroom for c in a.candidates if c.headroom is not None), None)
    return ["setting", "held"] + ([o.objective for o in first.objectives] if first is not None else [])


def headroom_lines(a: Advice) -> list[list[str]]:
    """Per candidate: replays held, and each objective's margin kept in 95 % of them / its worst (judged with
    the stall threshold lowered by the margin)."""
    return [[c.label, _held(c)] + [_cell(o, a.margin) for o in c.headroom.objectives]
            for c in a.candidates if c.headroom is not None]


def fit_lines(a: Advice) -> list[list[str]]:
    return [[r.figure, _num(r.measured, 2), _num(r.predicted, 2), _pct(r.error)] for r in a.fit]


def _has_capacity(a: Advice) -> bool:
    return any(c.capacity_requests_per_s is not None or c.capacity_note for c in a.candidates)


def _capacity(c: CandidateResult) -> str:
    value = _num(c.capacity_requests_per_s, 2)
    return f"≥ {value}" if c.capacity_note.startswith("at least") else value


def candidate_lines(a: Advice, short: bool = False) -> list[list[str]]:
    """Each candidate's replayed figures (the scenario's seed); the full form adds its outcome (within every limit
    only if it held in the replays required, else what missed), its replays and its least margin (the console
    says those in sentences: ``candidate_line``)."""
    rec = a.recommendation
    return [[_mark(c, rec) + c.label, *(_num(c.figures.get(k)) for k in COLUMNS),
             _num(c.figures.get("prefill-induced stalls per 1k tokens"), 2), _num(c.goodput_requests_per_s, 2),
             *([_capacity(c)] if _has_capacity(a) else []),
             *([] if short else [_outcome(c), _held(c), "–" if c.headroom is None else least(c.headroom)
                                 + undecided(c.headroom)])]
            for c in a.candidates]


def candidate_head(a: Advice, short: bool = False) -> list[str]:
    head, tail = (SHORT_HEAD, 0) if short else (CANDIDATE_HEAD, 3)
    capacity = ["capacity" if short else "capacity req/s"] if _has_capacity(a) else []
    return head[:len(head) - tail] + capacity + head[len(head) - tail:]


def objective_head(a: Advice) -> list[str]:
    first = a.candidates[0].objectives if a.candidates else []
    return ["setting"] + [f"{o['objective']} {o.get('comparison', '<=')} {_num(o['threshold'], 2)}" for o in first]


def objective_lines(a: Advice) -> list[list[str]]:
    """Each candidate's value of each objective, marked pass (✓), fail (✗) or inconclusive (?)."""
    mark = {True: "✓", False: "✗", None: "?"}
    return [[c.label] + [f"{_num(o['value'], 2)} {mark[o['passed']]}" for o in c.objectives] for c in a.candidates]


CANDIDATE_HEAD = ["setting", *(f"{k} (ms)" for k in COLUMNS), "induced /1k", "goodput req/s",
                  "outcome", "replays", "least margin kept"]
SHORT_HEAD = ["setting", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "worst gap", "induced/1k", "goodput"]
FIT_HEAD = ["figure", "measured", "replayed", "error"]
HEADROOM_NOTE = ("Each cell: the margin kept in 95 % of the replays / the worst, as a share of the limit; the stall "
                 "objectives count the gaps within the margin of the stall threshold (docs/verdicts.md).")


def markdown(a: Advice) -> str:
    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + \
               ["| " + " | ".join(r) + " |" for r in rows]

    lines = [f"# Advice for {a.run_dir}", ""] + [f"**{line}**  " for line in recommendation_lines(a)] + [""]
    if a.costs:
        lines += ["What it changes against the current setting (both replayed):", ""] + \
                 [f"- {c}" for c in a.costs] + [""]
    lines += [f"Engine: {a.engine}; the server's settings (from {a.settings_source}): "
              + ", ".join(f"{k}={v}" for k, v in a.current.items()), "",
              "## How well the fitted model replays the run", ""] + table(FIT_HEAD, fit_lines(a))
    alone = on_run_lines(a)
    lines += ["", alone[0], ""] + [f"- {line.strip()}" for line in alone[1:]] + [""] if alone else []
    lines += ["", "## Every candidate, replayed", ""] + [f"- {candidate_line(c)}" for c in a.candidates] + [""]
    lines += table(candidate_head(a), candidate_lines(a))
    lines += ["", "## Every objective per candidate", ""] + table(objective_head(a), objective_lines(a))
    lines += ["", f"## Headroom: {_rule(a)}", "", HEADROOM_NOTE, ""] + table(headroom_head(a), headroom_lines(a))
    cost = a.calibration.get("cost", {})
    lines += ["", "## The fitted cost model", "", ", ".join(f"{k} = {v:.4g}" for k, v in cost.items())
              + f"; arrival delay {a.calibration.get('arrival_delay_ms', 0):.1f} ms", ""]
    if a.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in a.notes] + [""]
    return "\n".join(lines)


def console_tables(a: Advice) -> list[Any]:
    fit = Table(title="the fitted model's replay of the run", title_justify="left", box=None)
    for h in FIT_HEAD:
        fit.add_column(h, justify="left" if h == "figure" else "right")
    for row in fit_lines(a):
        fit.add_row(*row)
    cands = Table(title="every candidate, replayed (ms; goodput req/s)", title_justify="left", box=None)
    for h in candidate_head(a, short=True):
        cands.add_column(h, justify="left" if h == "setting" else "right", no_wrap=h == "setting")
    for row in candidate_lines(a, short=True):
        cands.add_row(*row)
    return [Fitted(fit, ("figure",)), Fitted(cands, ("setting",))] + _margins_table(a)


def console_lines(a: Advice) -> list[str]:
    """After the tables: one sentence per candidate, then the objectives judged on the measured run alone."""
    head = (f"each candidate (it holds when {required_of(a)} of its {plural(a.seeds, 'replay')} keep a "
            f"{a.margin * 100:g} % margin; its replays stop once it cannot):")
    return [head] + [f"  {candidate_line(c)}" for c in a.candidates] + on_run_lines(a)


def _margins_table(a: Advice) -> list[Any]:
    """The recommended (else the closest) candidate's margin on each objective over its replays."""
    index = a.recommended if a.recommended is not None else a.closest
    c = a.candidates[index] if index is not None else None
    if c is None or c.headroom is None:
        return []
    h = c.headroom
    t = Table(title=f"{c.label}: margins over {plural(h.replays, 'replay')} run (needed: {a.margin * 100:g} % in "
                    f"{h.required} of {h.seeds})",
              title_justify="left", box=None)
    for head in ("objective", "limit", "kept in 95 %", "worst", "short", "undecided"):
        t.add_column(head, justify="left" if head == "objective" else "right")
    for o in h.objectives:
        t.add_row(o.objective, f"{o.comparison} {_num(o.limit, 2)}", margin_pct(o.kept), margin_pct(o.worst),
                  str(o.short), str(o.undecided))
    return [Fitted(t, ("objective",))]


def html_section(a: Advice) -> str:
    """report.html's advice section (the page's own table style)."""
    def table(head: list[str], rows: list[list[str]]) -> str:
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"

    costs = "".join(f"<li>{html.escape(c)}</li>" for c in a.costs)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in a.notes)
    return ("<section id=\"advice\"><h2>Advice: what to change</h2>"
            + "".join(f"<p><strong>{html.escape(line)}</strong></p>" for line in recommendation_lines(a))
            + (f"<ul>{costs}</ul>" if costs else "")
            + "".join(f"<p>{html.escape(line)}</p>" for line in on_run_lines(a))
            + "<h3>The fitted model's replay of the run</h3>" + table(FIT_HEAD, fit_lines(a))
            + "<h3>Every candidate, replayed</h3>"
            + "<ul>" + "".join(f"<li>{html.escape(candidate_line(c))}</li>" for c in a.candidates) + "</ul>"
            + table(candidate_head(a), candidate_lines(a))
            + "<h3>Every objective per candidate</h3>" + table(objective_head(a), objective_lines(a))
            + f"<h3>Headroom: {html.escape(_rule(a))}</h3><p>{html.escape(HEADROOM_NOTE)}</p>"
            + table(headroom_head(a), headroom_lines(a))
            + (f"<ul class=\"notes\">{notes}</ul>" if notes else "") + "</section>")
