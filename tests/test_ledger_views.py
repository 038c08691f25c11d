"""The SLO-miss ledger's views, from a summary whose ``misses`` block and misses.parquet rows are built by hand in
the shape analysis/ledger.py writes them (plan.md §1.3): the console's top causes, summary.md's table, report.html's
section with the evidence and the miss lane, and compare's per-cause change. Pure and fast; a summary written
before the ledger renders as it did."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from rich.console import Console

from loadgen.analysis.compare_basis import miss_change
from loadgen.analysis.result import RunResult
from loadgen.report.compare_report import compare_html, compare_markdown, print_misses
from loadgen.report.console import print_summary
from loadgen.report import html as html_module
from loadgen.report.html import render_page
from loadgen.report.miss_lane import CAUSE_COLORS, miss_lane
from loadgen.report.misses_report import cause_meanings, console_lines, worst_misses
from loadgen.report.writers import junit_xml, summary_markdown

DATA = Path(__file__).parent / "data"
S = 1_000_000_000
T0 = 50 * S  # the run's time origin (monotonic ns)


def block(counts: dict[str, tuple[int, int]], of: int, window_s: float = 60.0) -> dict[str, Any]:
    """A ``misses`` block: per cause (requests, goodput lost), sorted as the ledger sorts it."""
    n = sum(r for r, _ in counts.values())
    by = {c: {"requests": r, "share": r / n, "goodput_lost": g, "goodput_lost_per_s": g / window_s}
          for c, (r, g) in sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[0]))}
    return {"requests": n, "of": of, "share": n / of, "limits": {"ttft_ms": 2000.0, "e2e_ms": 20000.0},
            "by_cause": by, "unexplained_share": counts.get("unknown", (0, 0))[0] / n,
            "top": list(by)[:3]}


RUN = {"queueing": (30, 28), "prefill": (9, 9), "own_prompt": (3, 3)}


def summary(misses: dict[str, Any] | None = None, classes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "golden_summary.json").read_text())
    if misses is not None:
        data["misses"] = misses
    for name, b in (classes or {}).items():
        data["classes"][name]["misses"] = b
    return data


def result_of(data: dict[str, Any]) -> RunResult:
    return RunResult.from_dict(data)  # as report/build.py gets it: summary.json read back


def ledger_result() -> RunResult:
    classes = {"victim": block({"queueing": (25, 24), "prefill": (9, 9)}, 1000),
               "aggressor": block({"queueing": (5, 4), "own_prompt": (3, 3)}, 200)}
    return result_of(summary(block(RUN, 1200), classes))


def misses_frame() -> pl.DataFrame:
    """Five misses: two queueing, one prefill with its culprits, one own prompt, one server error."""
    rows = [
        (0, 11, "victim", 1.5, ["ttft_ms"], "ttft_ms", 3200.0, 2000.0, "queueing",
         "waited 2,600 ms beyond its own 210 ms prefill (excess 1,200 ms)", []),
        (0, 12, "victim", 1.6, ["ttft_ms", "e2e_ms"], "ttft_ms", 2500.0, 2000.0, "queueing",
         "waited 1,900 ms beyond its own 200 ms prefill (excess 500 ms)", []),
        (1, 40, "victim", 7.25, ["itl_ms"], "itl_ms", 900.0, 300.0, "prefill",
         "a 900 ms gap under the prefill of #38 (30,000 tokens) and #39", [38, 39]),
        (1, 41, "aggressor", 9.0, ["ttft_ms"], "ttft_ms", 2300.0, 2000.0, "own_prompt",
         "its own prefill of 30,000 tokens takes 2,250 ms", []),
        (0, 50, "victim", 12.0, ["error"], "error", None, None, "server_error", "HTTP 503", []),
    ]
    cols = ["worker", "seq", "class_name", "t_s", "missed", "metric", "value_ms", "limit_ms", "cause", "evidence",
            "culprits"]
    frame = pl.DataFrame([dict(zip(cols, r)) for r in rows],
                         schema_overrides={"culprits": pl.List(pl.Int64), "value_ms": pl.Float64,
                                           "limit_ms": pl.Float64})
    return frame.with_columns(t_intended_ns=(T0 + pl.col("t_s") * S).cast(pl.Int64),
                              excess_ms=pl.col("value_ms") - pl.col("limit_ms"),
                              good=pl.col("cause") != "queueing").drop("t_s")


def console_text(result: RunResult) -> str:
    out = io.StringIO()
    print_summary(Console(file=out, width=160, color_system=None), result, "runs/x")
    return out.getvalue()


def test_the_console_names_the_top_causes_after_the_verdict() -> None:
    text = console_text(ledger_result())
    line = "misses: 42 of 1,200 requests — queueing 30 (goodput lost 28), prefill 9, own_prompt 3; unexplained 0"
    assert line in text and text.index("verdict:") < text.index(line)
    assert "  victim: 34 of 1,000 requests — queueing 25 (goodput lost 24), prefill 9; unexplained 0" in text
    assert "  aggressor: 8 of 200 requests — queueing 5 (goodput lost 4), own_prompt 3; unexplained 0" in text


def test_the_console_says_goodput_lost_only_where_some_was() -> None:
    """A run without slo.goodput loses goodput only to errors: a stalled stream that finished is still good, and
    '(goodput lost 0)' beside its cause would read as a figure that means something."""
    (line,) = console_lines(result_of(summary(block({"prefill": (113, 0), "prefill_burst": (4, 0)}, 441))))
    assert line == "misses: 117 of 441 requests — prefill 113, prefill_burst 4; unexplained 0"


def test_unexplained_misses_are_counted_and_a_long_tail_of_causes_is_summed() -> None:
    many = {"queueing": (10, 10), "prefill": (8, 8), "network": (5, 5), "client_lag": (4, 4), "load": (2, 2),
            "unknown": (1, 1)}
    (line,) = console_lines(result_of(summary(block(many, 500))))
    assert line == ("misses: 30 of 500 requests — queueing 10 (goodput lost 10), prefill 8, network 5, client_lag 4, "
                    "2 more cause(s) 3; unexplained 1")
    (none,) = console_lines(result_of(summary({**block(RUN, 1200), "requests": 0, "by_cause": {}, "top": []})))
    assert none == "misses: none of 1,200 requests missed a limit"
    nothing = {**block(RUN, 1200), "of": 0, "requests": 0, "by_cause": {}, "top": []}
    (empty,) = console_lines(result_of(summary(nothing)))
    assert empty == "misses: no request measured"  # not "none of 0 requests"


def test_summary_md_has_the_per_cause_table_with_each_meaning() -> None:
    md = summary_markdown(ledger_result(), "job")
    section = md.split("### Why requests missed")[1]
    assert "42 of 1,200 measured requests missed a limit (3.5%); goodput lost 40 (0.67 req/s)" in section
    assert "ttft\\_ms ≤ 2,000 ms, e2e\\_ms ≤ 20,000 ms; every failed request" in section
    assert "| cause | requests | share of misses | goodput lost | goodput lost (req/s) | what it means |" in section
    queueing = next(line for line in section.splitlines() if line.startswith("| queueing"))
    assert queueing.startswith("| queueing | 30 | 71.4% | 28 | 0.47 | ")
    assert md_meaning("queueing") in queueing
    rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| ") and "%" in line]
    assert rows[:3] == ["| queueing", "| prefill", "| own\\_prompt"]  # most misses first
    assert "| victim | 34 | 1,000 | 3.4% | queueing 25, prefill 9 |" in section  # per class, in a two-class run


def md_meaning(cause: str) -> str:
    from loadgen.report.writers import md_escape
    return md_escape(cause_meanings()[cause])


@pytest.fixture
def no_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page without the Vega bundle inlined (~1 s to load; not what these tests are about)."""
    monkeypatch.setattr(html_module, "vega_bundle", lambda: "")


@pytest.mark.usefixtures("no_bundle")
def test_the_report_section_shows_causes_evidence_culprits_and_the_lane() -> None:
    misses = misses_frame()
    lane = miss_lane(misses, T0, 20.0)
    assert lane is not None
    page = render_page(ledger_result(), "job", "run", [], misses=misses, t0_ns=T0, miss_lane=lane)
    section = page.split('<section id="misses">')[1]
    assert section.index("<h2>Why requests missed</h2>") < section.index('id="miss-causes"')
    for cause in ("queueing", "prefill", "own_prompt"):
        assert f'<td class="text">{cause}</td>' in section
    assert "waited 2,600 ms beyond its own 210 ms prefill (excess 1,200 ms)" in section
    assert "<td>#40</td>" in section and '<td class="text">#38, #39</td>' in section
    assert "<td>7.2</td>" in section  # intended send: 7.25 s after the run's origin
    assert 'id="miss-classes"' in section and '<div id="miss_lane" class="chart"></div>' in section
    assert page.index("<h2>Tail spikes</h2>") < page.index('<section id="misses">')


def test_the_worst_misses_show_each_cause_s_worst_first() -> None:
    worst = worst_misses(misses_frame())
    # each cause's worst (the most misses' cause first, then how far over its limit; an error last), then the rest
    assert worst["seq"].to_list() == [11, 40, 41, 50, 12]


def test_the_lane_holds_one_mark_per_miss_coloured_by_cause() -> None:
    misses = misses_frame()
    chart = miss_lane(misses, T0, 20.0)
    assert chart is not None
    spec = chart.spec(validate=True)
    (rows,) = spec["datasets"].values()
    assert len(rows) == misses.height
    assert sorted((r["seq"], r["cause"]) for r in rows) == sorted(zip(misses["seq"], misses["cause"]))
    assert {r["seq"]: r["t_s"] for r in rows}[40] == pytest.approx(7.25)  # at its intended send
    color = spec["encoding"]["color"]
    assert color["field"] == "cause" and spec["mark"]["type"] == "tick"
    assert dict(zip(color["scale"]["domain"], color["scale"]["range"])) == {
        c: CAUSE_COLORS[c] for c in ("server_error", "prefill", "queueing", "own_prompt")}
    assert color["scale"]["domain"] == [c for c in cause_meanings() if c in set(misses["cause"])]  # decision order
    assert miss_lane(misses.clear(), T0, 20.0) is None and miss_lane(None, T0, 20.0) is None
    assert list(CAUSE_COLORS) == list(cause_meanings())  # every cause of the registry has its colour, in its order
    assert len(set(CAUSE_COLORS.values())) == len(CAUSE_COLORS)


def test_junit_carries_the_misses_as_properties() -> None:
    xml = junit_xml(ledger_result(), "job").decode()
    assert '<property name="misses.requests" value="42" />' in xml
    assert '<property name="misses.top_causes" value="queueing, prefill, own_prompt" />' in xml


@pytest.mark.usefixtures("no_bundle")
def test_an_old_summary_without_the_ledger_renders_as_before() -> None:
    old = result_of(summary())
    assert old.misses is None
    text = console_text(old)
    md = summary_markdown(old, "job")
    page = render_page(old, "job", "run", [], misses=None)
    assert "misses" not in text and "Why requests missed" not in md and 'id="misses"' not in page
    assert "misses." not in junit_xml(old, "job").decode()


@pytest.mark.usefixtures("no_bundle")
def test_compare_gives_per_cause_deltas() -> None:
    base = summary(block(RUN, 1200))
    new = summary(block({"queueing": (6, 5), "prefill": (9, 7), "preemption": (4, 4)}, 1180))
    change = miss_change(base, new)
    assert change["ledger"] == {"base": True, "new": True}
    assert change["delta_requests"] == 19 - 42
    by = {r["cause"]: r for r in change["causes"]}
    assert [r["cause"] for r in change["causes"]] == ["queueing", "prefill", "preemption", "own_prompt"]
    assert (by["queueing"]["base_requests"], by["queueing"]["new_requests"], by["queueing"]["delta_requests"]) == (
        30, 6, -24)
    assert by["preemption"]["base_requests"] == 0 and by["preemption"]["delta_goodput_lost"] == 4
    assert by["own_prompt"]["new_requests"] == 0 and by["own_prompt"]["delta_requests"] == -3
    assert by["prefill"]["delta_share"] == pytest.approx(9 / 19 - 9 / 42)
    doc = doc_with(change)
    md = compare_markdown(doc, [])
    assert "misses: 42 of 1,200 (3.5%) → 19 of 1,180 (1.6%) (-23); by cause, base → new" in md
    assert "| queueing | 30 → 6 | -24 | 71% → 32% | 28 → 5 |" in md
    assert "| preemption | 0 → 4 | +4 |" in md
    assert '<table id="misses">' in compare_html(doc, []) and "<td>30 → 6</td>" in compare_html(doc, [])
    out = io.StringIO()
    print_misses(Console(file=out, width=120, color_system=None), doc)
    assert "queueing" in out.getvalue() and "30 → 6" in out.getvalue()


@pytest.mark.usefixtures("no_bundle")
def test_compare_with_a_run_written_before_the_ledger_says_so() -> None:
    change = miss_change(summary(), summary(block(RUN, 1200)))
    assert change == {"ledger": {"base": False, "new": True}, "causes": []}
    md = compare_markdown(doc_with(change), [])
    assert "misses by cause: no ledger in the base run's summary" in md and "| queueing" not in md
    old_doc = doc_with(None)
    del old_doc["misses"]  # a compare.json written before the ledger
    assert "Why requests missed" not in compare_markdown(old_doc, []) + compare_html(old_doc, [])


def doc_with(misses: dict[str, Any] | None) -> dict[str, Any]:
    change = {"base": "fail", "new": "pass", "changed": True, "worse": False, "objectives_changed": [],
              "objectives": []}
    return copy.deepcopy({"verdict_change": change, "base": "a", "new": "b", "verdict": "ok", "regressed": [],
                          "exit_code": 0, "confidence": 0.95, "replicates": 1000, "paired": True, "warnings": [],
                          "misses": misses, "metrics": []})


def test_a_miss_row_says_error_no_answer_or_the_value() -> None:
    from loadgen.report.misses_report import miss_row
    base = {"seq": 7, "class_name": "c", "t_intended_ns": T0 + 2 * S, "limit_ms": 500.0, "cause": "own_prompt"}
    cells = {m: miss_row({**base, "metric": m, "value_ms": v}, T0)[4]
             for m, v in (("error", None), ("ttft_answer_ms", None), ("ttft_ms", 812.0))}
    assert cells["error"] == "error" and cells["ttft_answer_ms"] == "no answer" and "812" in cells["ttft_ms"]
