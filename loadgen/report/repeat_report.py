"""Views of a repeat (``loadgen run --repeat N``): the console, summary.md, junit.xml and repeat.html. Each says
the combined verdict and its reasons, then per objective and per metric the runs' values, the across-run mean,
its confidence interval and the coefficient of variation."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from loadgen.analysis.repeat_result import ObjectiveSpread, RepeatResult, Spread
from loadgen.report.console import STYLE
from loadgen.report.fit import fit, print_legend
from loadgen.report.html import e, page
from loadgen.report.writers import fmt, md_escape

OBJECTIVE_HEAD = ["objective", "limit", "mean", "CI", "CV", "runs", "decision"]
METRIC_HEAD = ["metric", "mean", "CI", "CV", "sd", "values"]


def _ci(s: Spread) -> str:
    return "–" if s.ci_low is None or s.ci_high is None else f"[{fmt(s.ci_low)}, {fmt(s.ci_high)}]"


def _cv(s: Spread) -> str:
    return "–" if s.cv is None else f"{s.cv * 100:.1f}%"


def objective_rows(r: RepeatResult) -> list[list[str]]:
    return [[o.objective, f"{o.comparison} {fmt(o.threshold)}", fmt(o.spread.mean), _ci(o.spread), _cv(o.spread),
             " ".join(o.run_decisions), o.decision] for o in r.objectives]


def metric_rows(r: RepeatResult) -> list[list[str]]:
    return [[name, fmt(s.mean), _ci(s), _cv(s), fmt(s.sd), " ".join(fmt(v) for v in s.values)]
            for name, s in r.metrics.items() if s.mean is not None]


def headline(r: RepeatResult) -> str:
    return (f"{r.verdict.upper()} over {len(r.runs)} runs (seeds {r.seeds[0]} to {r.seeds[-1]}; "
            f"{r.confidence * 100:g}% t-intervals across runs)")


def print_repeat(console: Console, r: RepeatResult) -> None:
    for title, head, rows in (("objectives across runs", OBJECTIVE_HEAD, objective_rows(r)),
                              ("metrics across runs", METRIC_HEAD, metric_rows(r))):
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
        for col in head:
            table.add_column(col, justify="left" if col in ("objective", "metric", "decision", "runs") else "right")
        for row in rows:
            table.add_row(*row)
        console.print(fit(console, table, ("objective", "metric", "decision")))
    print_legend(console, [name.split(".")[0] for name in r.metrics])
    console.print(f"verdict: [{STYLE[r.verdict]}]{headline(r)}[/]" + (f"  ({r.out_dir})" if r.out_dir else ""),
                  highlight=False)
    for reason in r.reasons:
        console.print(f"  {reason}", highlight=False)


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
            + ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows])


def summary_markdown(r: RepeatResult) -> str:
    lines = [f"# loadgen run --repeat {len(r.runs)}: {md_escape(r.name)}", "",
             f"**{md_escape(headline(r))}** (exit {r.exit_code})", ""]
    lines += [f"- {md_escape(x)}" for x in r.reasons] + ([""] if r.reasons else [])
    lines += ["## Objectives", ""] + _md_table(OBJECTIVE_HEAD, objective_rows(r))
    lines += ["", "## Metrics", ""] + _md_table(METRIC_HEAD, metric_rows(r))
    lines += ["", "## Runs", ""] + _md_table(["run", "seed", "verdict"], [
        [x["dir"], str(x["seed"]), x["verdict"]] for x in r.runs])
    return "\n".join(lines) + "\n"


def _objective_text(o: ObjectiveSpread) -> str:
    return (f"{o.objective}: mean {fmt(o.spread.mean)} {_ci(o.spread)}, CV {_cv(o.spread)}, limit {o.comparison} "
            f"{fmt(o.threshold)}; runs: {' '.join(o.run_decisions)}")


def junit_xml(r: RepeatResult) -> bytes:
    """One test case per objective on its across-run interval (failure: wholly beyond the limit; skipped:
    undecided), one per run (its own verdict), the combined verdict's reasons as system-out."""
    objectives, runs = r.objectives, r.runs
    suite = ET.Element("testsuite", name=f"loadgen.repeat.{r.name}", tests=str(len(objectives) + len(runs)),
                       failures=str(sum(o.decision == "fail" for o in objectives)
                                    + sum(x["verdict"] == "fail" for x in runs)), errors="0",
                       skipped=str(sum(o.decision == "inconclusive" for o in objectives)
                                   + sum(x["verdict"] == "inconclusive" for x in runs)), time=f"{r.wall_s:.3f}")
    props = ET.SubElement(suite, "properties")
    for key, value in {"verdict": r.verdict, "repeat": len(runs), "seeds": " ".join(map(str, r.seeds)),
                       "confidence": r.confidence}.items():
        ET.SubElement(props, "property", name=key, value=str(value))
    for o in objectives:
        case = ET.SubElement(suite, "testcase", classname=f"loadgen.repeat.{r.name}.slo", name=o.objective, time="0")
        _outcome(case, o.decision, _objective_text(o), "SLOViolation")
    for x in runs:
        case = ET.SubElement(suite, "testcase", classname=f"loadgen.repeat.{r.name}.run", name=x["dir"], time="0")
        _outcome(case, x["verdict"], f"{x['dir']} (seed {x['seed']}): {x['verdict']}", "RunFailed")
    ET.SubElement(suite, "system-out").text = "\n".join([headline(r), *r.reasons])
    root = ET.Element("testsuites", name="loadgen", time=f"{r.wall_s:.3f}")
    root.append(suite)
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8")


def _outcome(case: ET.Element, decision: str, detail: str, kind: str) -> None:
    if decision == "fail":
        ET.SubElement(case, "failure", message=detail, type=kind).text = detail
    elif decision != "pass":
        ET.SubElement(case, "skipped", message=f"{decision}: {detail}")


def _html_table(table_id: str, head: list[str], rows: list[list[str]], decision_col: int | None = None) -> str:
    def cell(i: int, v: str) -> str:
        return f"<td class=\"{e(v)}\">{e(v)}</td>" if i == decision_col else f"<td>{e(v)}</td>"
    body = "".join("<tr>" + "".join(cell(i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table id=\"{table_id}\"><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr>{body}</table>"


def render_html(r: RepeatResult) -> str:
    reasons = "".join(f"<li>{e(x)}</li>" for x in r.reasons)
    runs = "".join(f"<tr><td><a href=\"{e(x['dir'])}/report.html\">{e(x['dir'])}</a></td><td>{e(x['seed'])}</td>"
                   f"<td class=\"{e(x['verdict'])}\">{e(x['verdict'])}</td></tr>" for x in r.runs)
    body: list[Any] = [
        f"<h1>loadgen run --repeat {len(r.runs)}: {e(r.name)} <span class=\"badge {e(r.verdict)}\" id=\"verdict\">"
        f"{e(r.verdict.upper())}</span></h1><p class=\"meta\">{e(headline(r))}; {r.wall_s:.0f} s in all</p>",
        f"<ul>{reasons}</ul>" if reasons else "",
        "<h2>Objectives across runs</h2>", _html_table("objectives", OBJECTIVE_HEAD, objective_rows(r), 6),
        "<h2>Metrics across runs</h2>", _html_table("metrics", METRIC_HEAD, metric_rows(r)),
        f"<h2>Runs</h2><table id=\"runs\"><tr><th>run</th><th>seed</th><th>verdict</th></tr>{runs}</table>"]
    return page(f"loadgen repeat: {r.name}", "".join(body))
