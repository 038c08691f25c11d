"""Output that fits (issue 40): every console printer rendered at 80 and 120 columns from in-process results — no
line wider than the console, nothing cut with "…", the key cells (a failing objective's name, compare's status
and change, advise's setting, repeat's decision) whole, and the legend that tells the look-alike rows apart."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
from rich.console import Console
from rich.table import Table

from loadgen.analysis.advice_result import Advice, CandidateResult, FitRow
from loadgen.analysis.check_findings import Finding
from loadgen.analysis.check_result import CheckResult
from loadgen.analysis.compare import METRICS as COMPARED, MetricComparison
from loadgen.analysis.repeat_result import ObjectiveSpread, RepeatResult, Spread
from loadgen.analysis.result import RunResult
from loadgen.report.advice_report import console_tables
from loadgen.report.check_report import print_check
from loadgen.report.compare_report import print_comparison
from loadgen.report.console import print_summary
from loadgen.report.fit import fit, legend, needed_width
from loadgen.report.history import collect_runs, print_history
from loadgen.report.repeat_report import print_repeat
from tests.test_report_sessions import result_with

DATA = Path(__file__).parent / "data"
LONG = "stalls.max_prefill_induced_per_1k_tokens"  # golden_summary.json's failing objective
SETTING = "max_num_batched_tokens=512,max_num_seqs=64,enable_chunked_prefill=true"


def console_of(width: int) -> Console:
    return Console(width=width, record=True, color_system=None, file=io.StringIO())


def golden() -> RunResult:
    return RunResult.from_dict(json.loads((DATA / "golden_summary.json").read_text()))


def summary(console: Console) -> list[str]:
    print_summary(console, golden(), "reports/20261127-050000-golden-run-with-a-long-name")
    return [LONG, "FAIL", "ttft_service_ms", "chunk_gap_ms", "queue_delay_ms", "total", "culprits"]


def agentic(console: Console) -> list[str]:
    """A run with reasoning, sessions (test_report_sessions' shapes) and a multi-turn conversation table."""
    result = result_with()
    turn = {"turn": 0, "requests": 30, "ok": 30, "ttft_ms": {"p50": 25.5, "p99": 1539.0}, "prompt_tokens_mean": 5120.5,
            "cached_tokens_mean": 4096.0, "cache_hit_ratio": 0.8}
    result.conversations = {"turns": [turn, {**turn, "turn": 1}], "conversations": {
        "count": 15, "failed": 0, "turns_mean": 2.0, "turns_max": 2, "duration_s": {"p50": 6.1, "p99": 9.8}}}
    print_summary(console, result, "reports/20261127-050000-agentic-sessions")
    return ["victim", "aggressor", "session (ms)", "agent step (ms)", "cache hit per session", "hit", LONG]


def comparison(console: Console) -> list[str]:
    def row(metric: str, base: float, new: float, status: str) -> MetricComparison:
        worse = (new - base) / base
        return MetricComparison(metric, base, new, worse, worse - 0.05, worse + 0.05, 0.10, status, COMPARED[metric])
    rows = [row("ttft_ms.p99", 812.25, 1095.5, "regressed"), row("itl_ms.p99", 41.5, 40.9, "unchanged"),
            row("e2e_ms.p50", 2736.0, 2690.0, "uncertain")]
    doc = {"base": "reports/20261126-231500-nightly-baseline", "new": "reports/20261127-050000-nightly-candidate",
           "confidence": 0.95, "regressed": ["ttft_ms.p99"], "exit_code": 1, "warnings": [],
           "verdict_change": {"base": "pass", "new": "fail", "worse": True, "changed": True,
                              "objectives": [{"objective": "ttft_ms.p99", "base": "pass", "new": "fail",
                                              "changed": True}]}}
    print_comparison(console, doc, rows)
    return ["ttft_ms.p99", "regressed", "unchanged", "uncertain", "+34.9%", "itl_ms.p99"]


def advice(console: Console) -> list[str]:
    objectives = [{"objective": "ttft_ms.p99", "value": 1800.0, "threshold": 2000.0, "comparison": "<=",
                   "passed": True, "decision": "pass"},
                  {"objective": LONG, "value": 3.2, "threshold": 1.0, "comparison": "<=", "passed": False,
                   "decision": "fail"}]
    figures: dict[str, float | None] = {"TTFT p50": 25.5, "TTFT p99": 1800.0, "ITL p50": 8.3, "ITL p99": 16.5,
               "prefill-induced stalls per 1k tokens": 3.2}
    cands = [CandidateResult(SETTING, {}, [], "fail", objectives, figures, 3.83, {}),
             CandidateResult("current", {}, [], "fail", objectives, figures, 3.80, {})]
    a = Advice("run", "vllm", "run.json", {}, {}, [FitRow("TTFT p99 (ms)", 1790.0, 1800.0)], cands, None)
    for table in console_tables(a):
        console.print(table)
    return [SETTING, "current", "TTFT p99 (ms)"]


def repeat(console: Console) -> list[str]:
    spread = Spread([812.0, 840.5, 901.25, 799.0, 850.0], 5, 840.5, 39.1, 0.0465, 792.0, 889.0)
    r = RepeatResult("nightly", 0.95, [{"dir": f"run-{i}", "seed": i, "verdict": "pass", "exit_code": 0}
                                       for i in range(5)],
                     {"ttft_ms.p99": spread}, [ObjectiveSpread(LONG, "<=", 1.0, spread, ["fail"] * 5, "fail")],
                     "fail", [f"{LONG}: fails across runs"])
    print_repeat(console, r)
    return [LONG, "fail", "ttft_ms.p99"]


def check(console: Console) -> list[str]:
    findings = [Finding("coalescing", "finding", "the server sends several tokens per chunk: ITL below the chunk "
                        "gap is spread, not measured", {"tokens_per_chunk": 4.2, "chunks": 1200}),
                Finding("streaming", "ok", "streams token by token")]
    print_check(console, CheckResult({"base_url": "http://127.0.0.1:8000/v1", "model": "meta-llama/Llama-3.1-8B",
                                      "api": "chat", "engine": "vllm"}, findings, 12, 3.4))
    return ["coalescing", "streaming", "verdict"]


def history(console: Console) -> list[str]:
    """Two tiny run directories (summary.json and run.json) under a reports folder, as ``loadgen history`` reads."""
    reports = Path(tempfile.mkdtemp())
    for i, name in enumerate(("nightly-long-context-on-the-h100-box", "nightly-long-context-on-the-h200-box")):
        run_dir = reports / f"2026112{i}-050000-{name}"
        run_dir.mkdir()
        (run_dir / "summary.json").write_text((DATA / "golden_summary.json").read_text())
        (run_dir / "run.json").write_text(json.dumps({"scenario": {"name": name},
                                                      "started_at": f"2026-11-2{i}T05:00:00+0000"}))
    print_history(console, collect_runs(reports))
    shutil.rmtree(reports)
    return ["20261121-050000-nightly-long-context-on-the-h200-box", "nightly-long-context-on-the-h100-box", "fail"]


PRINTERS: dict[str, Callable[[Console], list[str]]] = {"run": summary, "agentic": agentic, "compare": comparison, "advise": advice,
                                                       "repeat": repeat, "check": check, "history": history}
LEGEND = {"run", "agentic", "compare"}  # printers of metric rows that look alike
SOFT_WRAPPED: set[str] = set()  # none now: check's summaries wrap in their own column (issue 50)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", list(PRINTERS))
def test_every_printer_fits_its_width_and_keeps_its_key_cells_whole(name: str, width: int) -> None:
    console = console_of(width)
    keys = PRINTERS[name](console)
    text = console.export_text()
    lines = text.splitlines()
    if name not in SOFT_WRAPPED:
        assert max(len(line) for line in lines) <= width, "\n".join(line for line in lines if len(line) > width)
    assert "…" not in text, text
    for key in keys:  # whole: on one line, never folded or cut
        assert any(key in line for line in lines), (key, text)
    if name in LEGEND:
        assert "loadgen explain NAME" in text and "from the intended send" in text


def test_a_table_too_wide_is_stacked_with_its_key_cells_first_and_nothing_lost() -> None:
    table = Table("objective", "value", "interval", "limit", "margin", "result")
    table.add_row(LONG, "3.88", "[3.1, 4.7]", "<= 1", "−288%", "[red]FAIL")
    assert needed_width(table) > 60
    console = console_of(60)
    console.print(fit(console, table, ("objective", "result")))
    lines = console.export_text().splitlines()
    assert lines[0].strip() == f"{LONG}  FAIL"  # the key cells, whole, on the row's first line
    assert "value: 3.88" in lines[1] and "limit: <= 1" in lines[1] and "margin: −288%" in "".join(lines[1:])
    wide = console_of(120)
    assert fit(wide, table, ("objective",)) is table  # where it fits, the table as it is


def test_the_legend_names_only_the_look_alike_rows_present() -> None:
    both = legend(["ttft_ms", "ttft_service_ms", "itl_ms", "chunk_gap_ms"])
    assert both is not None and "ttft_service_ms: from the actual send" in both and "chunk_gap_ms: per chunk" in both
    only = legend(["ttft_ms", "e2e_ms"])
    assert only is not None and "chunk_gap_ms" not in only and only.endswith("loadgen explain NAME")
    assert legend(["e2e_ms", "queue_delay_ms"]) is None


def _markdown() -> Any:
    from loadgen.report.writers import summary_markdown
    return summary_markdown(golden(), "golden")


def test_summary_md_says_the_legend_throughput_and_a_stall_objectives_tokens() -> None:
    text = _markdown()
    assert "loadgen explain NAME" in text and "ttft\\_service\\_ms" in text
    assert "tokens/s in" in text and "total" in text and "goodput = completed (no slo.goodput declared)" in text
    stall_row = next(line for line in text.splitlines() if line.startswith("| `stalls."))
    assert " tokens |" in stall_row
    assert "lift = stalls per output token while a long prompt prefilled" in text  # the lift explained once


def test_explain_lists_every_name_and_defines_one_from_the_vocabulary() -> None:
    from typer.testing import CliRunner

    from loadgen.cli.app import app
    from loadgen.core.vocabulary import CAUSES, METRICS, QUOTED_FIGURES

    runner = CliRunner()
    listed = runner.invoke(app, ["explain"])
    assert listed.exit_code == 0 and all(n in listed.output for n in (*METRICS, *CAUSES, *QUOTED_FIGURES))
    one = runner.invoke(app, ["explain", "chunk_gap_ms"])
    assert one.exit_code == 0 and METRICS["chunk_gap_ms"].description in " ".join(one.output.split())
    objective = runner.invoke(app, ["explain", LONG])
    assert objective.exit_code == 0 and "per 1,000 output tokens" in " ".join(objective.output.split())
    assert "MLPerf" in runner.invoke(app, ["explain", "tokens_per_s_per_user"]).output
    wrong = runner.invoke(app, ["explain", "ttf_ms"])
    assert wrong.exit_code == 2 and "did you mean ttft_ms?" in wrong.output
