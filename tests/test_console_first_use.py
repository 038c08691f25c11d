"""What a user meets first on the console (issue 50): `loadgen check` fits 80 columns (its evidence behind
--verbose); a clean PASS says so first and its stalls in one sentence; a server that is down is named as typed,
with a hint; a quick start prints no noise (cost, /models 404, a wrapped default-SLO line); `loadgen compare`
warns first and ends no line on a colon; report.html escapes the model name once."""

from __future__ import annotations

import copy
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from rich.console import Console

from loadgen.analysis.check_findings import Finding
from loadgen.analysis.check_result import CheckResult
from loadgen.analysis.compare_basis import miss_change
from loadgen.analysis.result import RunResult
from loadgen.plan.quick import DEFAULT_SLO_LINE
from loadgen.report import html as html_module
from loadgen.report.check_report import print_check
from loadgen.report.compare_report import print_comparison
from loadgen.report.console import print_summary
from tests.check_servers import CheckServer

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
WIDTH = 80


def cli(*args: str, columns: int = WIDTH, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": str(columns)}, timeout=timeout)


def console_of(width: int = WIDTH) -> Console:
    return Console(width=width, record=True, color_system=None, file=io.StringIO())


def too_wide(text: str, width: int = WIDTH) -> list[str]:
    return [line for line in text.splitlines() if len(line.rstrip()) > width]


# ---- 1. loadgen check fits the console -----------------------------------------------------------------------
EVIDENCE = {"repeated_e2e_ms_p50": 279.9, "fresh_e2e_ms_p50": 263.4, "repeated_decode_ms_p50": 251.7,
            "fresh_decode_ms_p50": 233.9, "repeated_ttft_ms_p50": 27.7, "fresh_ttft_ms_p50": 27.1,
            "repeated_same_text": True, "cached_tokens": 0, "repeated": 2, "fresh": 3, "statuses": [200, 200, 200]}


def check_result() -> CheckResult:
    findings = [Finding("caching", "finding", "a response or prefix cache answers repeated prompts faster: repeated "
                        "prompts take 120 ms, fresh ones 263 ms, so a run of repeated prompts measures the cache",
                        EVIDENCE),
                Finding("streaming", "ok", "answers stream (32 content chunks each) and end cleanly",
                        {"answers": 3, "failed": 0})]
    return CheckResult({"base_url": "http://127.0.0.1:8000/v1", "model": "meta-llama/Llama-3.1-8B-Instruct",
                        "api": "chat", "engine": "vllm"}, findings, 22, 8.3)


def test_check_fits_80_columns_and_its_evidence_is_behind_verbose() -> None:
    plain, verbose = console_of(), console_of()
    print_check(plain, check_result())
    print_check(verbose, check_result(), verbose=True)
    short, long = plain.export_text(), verbose.export_text()
    for text in (short, long):
        assert not too_wide(text), "\n".join(too_wide(text))
        assert "caching" in text and "verdict:" in text
    assert "=" not in short  # no key=value dump without --verbose
    assert "add --verbose" in short  # where the evidence is, said once (a finding)
    shown = " ".join(long.split())
    assert "repeated_e2e_ms_p50=279.9" in shown and "fresh=3" in shown  # every pair, wrapped, not cut


@pytest.fixture(scope="module")
def check_server() -> Iterator[CheckServer]:
    with CheckServer() as srv:
        yield srv


def test_the_check_command_at_80_columns_has_no_line_over_80(check_server: CheckServer) -> None:
    res = cli("check", "--base-url", check_server.url("cache"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert not too_wide(res.stdout), res.stdout
    assert " caching " in res.stdout and "_ms_p50=" not in res.stdout  # the evidence: --verbose (tested above)


# ---- 2. a clean PASS says so first; its stalls in one sentence ------------------------------------------------
STALLS = {"count": 11, "prefill_induced": 11, "lift": None, "lift_infinite": True, "spike_factor": 4.0,
          "min_gap_ms": 0.0, "baseline_itl_ms": {"quick": 7.74}, "long_prompt_tokens": 512,
          "worst": {"gap_ms": 43.6, "cause": "prefill", "culprit": 57, "culprit_prompt_tokens": 512},
          "top_culprits": [{"seq": 57, "stalls": 3, "stalled_ms": 107.5, "prompt_tokens": 512},
                           {"seq": 29, "stalls": 3, "stalled_ms": 107.5, "prompt_tokens": 512}]}
HEADLINE = ("11 stalls, 11 of them prefill-induced (lift ×∞: no stall outside long prefills), worst gap 44 ms caused "
            "by request 57 (512 prompt tokens)")


def golden() -> dict[str, Any]:
    return json.loads((DATA / "golden_summary.json").read_text())


def clean_pass() -> RunResult:
    """The quick start's shape: every prompt 512 tokens, every objective held with margin, stalls all prefill."""
    doc = golden()
    doc.update(verdict="pass", reasons=[], stall_headline=HEADLINE, stalls={**doc["stalls"], **STALLS},
               slo=[{**o, "passed": True, "decision": "pass"} for o in doc["slo"]])
    doc["requests"]["failed"] = 0
    doc["misses"] = {"requests": 0, "of": 39, "share": 0.0, "limits": {}, "by_cause": {}, "top": []}
    return RunResult.from_dict(doc)


def lines_of(result: RunResult) -> list[str]:
    console = console_of(120)
    print_summary(console, result, "reports/quick")
    return console.export_text().splitlines()


def test_a_clean_pass_says_nothing_missed_first_and_its_stalls_in_one_sentence() -> None:
    lines = lines_of(clean_pass())
    held = next(i for i, line in enumerate(lines) if line == "every objective held; no request missed")
    stall = lines[held + 1]  # right after it: one line, its threshold and where to look
    assert stall == "11 gaps ≥ 31 ms (4× the median) were prefill stalls (report.html › Tail spikes)"
    text = "\n".join(lines)
    for jargon in ("culprits", "lift", "×∞", "caused by request", "#57", "long prompt >="):
        assert jargon not in text, (jargon, text)


def test_a_fail_keeps_the_stall_detail_and_the_culprits() -> None:
    doc = golden()  # a FAIL on a stall objective
    doc.update(stall_headline=HEADLINE, stalls={**doc["stalls"], **STALLS})
    text = " ".join(" ".join(lines_of(RunResult.from_dict(doc))).split())  # as read, wrapped or not
    assert "verdict: FAIL" in text and "every objective held" not in text
    assert HEADLINE in text and "lift = stalls per output token" in text
    assert "culprits (the long prefills behind stalls, longest first):" in text and "#57: 512 prompt tokens" in text


# ---- 3. a server that is down: the URL as typed, what happened, what to try ---------------------------------
def closed_port() -> int:
    with socket.socket() as sock:  # bound, then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_that_is_down_is_named_as_typed_with_a_hint(tmp_path: Path) -> None:
    typed = f"http://127.0.0.1:{closed_port()}"
    res = cli("run", "--base-url", typed, "--duration", "2", "--no-progress", "--out", str(tmp_path / "r"))
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot reach {typed}: connection refused"), line
    assert f"{typed}/models" not in line and "Errno" not in line  # the URL the user typed, in words
    assert "Is the server running, and on that port?" in line and "`loadgen target sim`" in line
    assert not (tmp_path / "r").exists()


# ---- 4. a quick start's console says what matters ------------------------------------------------------------
def test_a_quick_start_on_the_simulator_prints_no_noise(tmp_path: Path) -> None:
    res = cli("run", "--base-url", "embedded", "--rate", "4", "--input-len", "512", "--output-len", "32",
              "--duration", "2", "--no-progress", "--no-png", "--out", str(tmp_path / "r"), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert DEFAULT_SLO_LINE in out.splitlines() and len(DEFAULT_SLO_LINE) <= WIDTH  # short, on one line
    assert "--slo ttft_ms.p99=2000" in DEFAULT_SLO_LINE
    for noise in ("cost", "price_per_hour", "power_metrics", "answered HTTP 404", "/v1 does"):
        assert noise not in out, (noise, out)
    assert "figures: MLPerf" in out  # the figures that were measured stay
    for routine in ("recognised by", "the word model matched all"):  # a known engine, estimates that all matched
        assert routine not in out, (routine, out)
    assert "recognised by" in (tmp_path / "r" / "summary.md").read_text()  # kept where the run is read at leisure


def test_no_cost_or_energy_absence_on_the_console_unless_declared() -> None:
    doc = golden()
    doc["figures"] = {"absent": {"cost_per_1m_output_tokens": "no cost.price_per_hour declared in the scenario",
                                 "cost_per_1m_total_tokens": "no cost.price_per_hour declared in the scenario",
                                 "energy_j_per_output_token": "no target.power_metrics declared"}}
    text = "\n".join(lines_of(RunResult.from_dict(doc)))
    assert "cost" not in text and "power_metrics" not in text
    doc["figures"] = {"currency": "USD", "absent": {"cost_per_1m_output_tokens": "no tokens were measured"}}
    assert "cost: no tokens were measured" in "\n".join(lines_of(RunResult.from_dict(doc)))  # asked: said


# ---- 5. compare: the warning first, no line ending on a colon ---------------------------------------------------
def compare_doc(base_misses: int, new_misses: int) -> dict[str, Any]:
    def summary(n: int) -> dict[str, Any]:
        by = {"queueing": {"requests": n, "share": 1.0, "goodput_lost": n}} if n else {}
        return {"misses": {"requests": n, "of": 100, "share": n / 100, "limits": {"ttft_ms": 2000.0},
                           "by_cause": by}}
    change = {"base": "pass", "new": "pass", "changed": False, "worse": False, "objectives": []}
    return copy.deepcopy({"verdict_change": change, "base": "reports/a", "new": "reports/b", "regressed": [],
                          "exit_code": 0, "confidence": 0.95, "replicates": 1000, "paired": False,
                          "warnings": ["different scenarios: 'a' vs 'b'"],
                          "misses": miss_change(summary(base_misses), summary(new_misses)), "metrics": []})


def compare_lines(doc: dict[str, Any]) -> list[str]:
    console = console_of(120)
    print_comparison(console, doc, [])
    return [line.rstrip() for line in console.export_text().splitlines() if line.strip()]


def test_compare_warns_first_and_says_when_neither_run_missed() -> None:
    lines = compare_lines(compare_doc(0, 0))
    assert lines[0] == "warning: different scenarios: 'a' vs 'b'"
    assert not any(line.endswith(":") for line in lines), lines
    assert "misses: none in either run (0 of 100 → 0 of 100)" in lines
    with_misses = compare_lines(compare_doc(3, 5))
    at = next(i for i, line in enumerate(with_misses) if line.startswith("misses: 3 of 100"))
    assert with_misses[at].endswith("by cause, base → new (docs/causes.md):")  # the per-cause table follows
    assert "queueing" in with_misses[at + 1] or "queueing" in "\n".join(with_misses[at + 1:])


# ---- 6. report.html escapes the model name once -------------------------------------------------------------
@pytest.mark.parametrize("model, once, twice", [
    ("a&b", "model a&amp;b", "a&amp;amp;b"),
    ("<script>alert(1)</script>", "model &lt;script&gt;alert(1)&lt;/script&gt;", "&amp;lt;script"),
    ("org/my_model", "model org/my_model", "my\\_model"),
])
def test_report_html_escapes_the_model_name_once(monkeypatch: pytest.MonkeyPatch, model: str, once: str,
                                                 twice: str) -> None:
    monkeypatch.setattr(html_module, "vega_bundle", lambda: "")
    for target in ({"base_url": "http://h:8000/v1", "model": model, "engine": "vllm"},
                   {**golden()["target"], "model": model}):
        doc = golden()
        doc["target"] = target
        page = html_module.render_page(RunResult.from_dict(doc), "run", "reports/run", [])
        assert once in page and twice not in page
        assert "<script>alert(1)" not in page
