"""``loadgen check``: the right finding on servers that coalesce, cache, send a role-only first chunk long
before the first token, or misreport usage (tests/check_servers.py, each with its ground truth); a clean bill on
a well-behaved server and on the embedded simulator; exit 2 in one line when there is nothing to audit. Timing
evidence is held to the servers' own configuration and write stamps, never to bare wall-clock bounds."""

from __future__ import annotations

import json
import socket
import statistics
from typing import Any, Iterator

import pytest

from loadgen import api
from loadgen.analysis.check_findings import FINDING, INFO, OK, ChunkTimes, Probe, buffering, caching, coalescing
from loadgen.analysis.check_result import CheckResult, verdict
from loadgen.run.check import PROBE_OUTPUT_TOKENS, builtin_scenario
from tests.check_servers import COALESCE, ITL_S, LIE_FACTOR, MAX_MODEL_LEN, PROMPT_LIE, CheckServer
from tests.run_helpers import run_cli

LINES = ["streaming", "first_chunk", "coalescing", "buffering", "caching", "usage", "after_done", "tokenizer",
         "tokenize_endpoint", "metrics_endpoint", "http", "compression", "keep_alive", "max_prompt"]
TIMING_TOLERANCE_MS = 25.0  # a loopback write's read on a busy 2-core machine (as tests/test_shapes.py)


@pytest.fixture(scope="module")
def servers() -> Iterator[CheckServer]:
    with CheckServer() as srv:
        yield srv


def check(servers: CheckServer, kind: str) -> CheckResult:
    """``api.check`` of the built-in scenario against one kind of server (in process)."""
    scenario = builtin_scenario(lambda p: api.load_scenario(p, [f"target.base_url={servers.url(kind)}"]))
    return api.check(scenario)


def statuses(findings: list[dict[str, Any]] | CheckResult) -> dict[str, str]:
    items = findings.to_json()["findings"] if isinstance(findings, CheckResult) else findings
    return {f["name"]: f["status"] for f in items}


def all_ok_but(**changed: str) -> dict[str, str]:
    return {name: changed.get(name, OK) for name in LINES}


def one_line_exit_2(res: Any) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stdout + res.stderr, res.stderr
    return lines[0]


# ---- through the command line ----------------------------------------------------------------------------
def test_a_well_behaved_server_gets_a_clean_bill_in_json_and_the_key_is_never_shown(servers):
    key = "sk-check-0123456789abcdef"
    res = run_cli("check", "--base-url", servers.url("clean"), "--api-key-env", "CHECK_TEST_KEY", "--json",
                  env={"CHECK_TEST_KEY": key}, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert (doc["verdict"], doc["exit_code"]) == ("clean", 0)
    assert statuses(doc["findings"]) == all_ok_but()
    assert [f["name"] for f in doc["findings"]] == LINES
    assert doc["target"]["model"] == "m" and doc["target"]["engine"] == "vllm"
    assert doc["requests"] >= 2 * 3 + 2  # every probe counted, the preflight's too
    by_name = {f["name"]: f for f in doc["findings"]}
    assert by_name["usage"]["evidence"]["completion_tokens"] == [PROBE_OUTPUT_TOKENS] * 3
    assert by_name["max_prompt"]["evidence"]["max_model_len"] == MAX_MODEL_LEN
    assert key not in res.stdout + res.stderr and key[:12] not in res.stdout + res.stderr
    assert servers.generation("clean"), "the probes reached the server"


def test_a_coalescing_server_is_a_finding_on_the_console_with_its_chunk_gap(servers):
    res = run_cli("check", "--base-url", servers.url("coalesce"), "--verbose", timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if " coalescing " in x)
    line, evidence = lines[at], lines[at + 1]  # --verbose: the evidence on the row under the line
    assert line.lstrip().startswith("!") and f"the server coalesces tokens ({COALESCE:.1f} per chunk)" in line
    assert f"tokens_per_chunk={COALESCE:.1f}" in evidence
    assert lines[-1].startswith("verdict: 1 finding(s) limit what can be measured here: coalescing (exit 1)")
    marks = {x.split()[1]: x.split()[0] for x in lines[1:-1] if x.split()[0] in ("!", "i", "✓", "✗")}
    info = ("metrics_endpoint", "max_prompt")
    assert marks == {name: "!" if name == "coalescing" else "i" if name in info else "✓" for name in LINES}
    gap_ms = float(evidence.split("chunk_gap_ms_p50=")[1].split(",")[0])
    assert abs(gap_ms - COALESCE * ITL_S * 1000) < TIMING_TOLERANCE_MS  # the server's chunk period
    search = next(x for x in lines if " max_prompt " in x)  # /models gives no max_model_len here: searched
    assert "/models gives no max_model_len" in search and "refused (HTTP 400)" in search


@pytest.mark.slow
def test_the_embedded_simulator_gets_a_clean_bill():
    res = run_cli("check", "scenarios/chat.yaml", "--json", env={"LOADGEN_BASE_URL": ""}, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert (doc["verdict"], doc["exit_code"], doc["target"]["base_url"]) == ("clean", 0, "embedded")
    assert statuses(doc["findings"]) == all_ok_but()


def test_an_unreachable_url_is_exit_2_in_one_line():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = run_cli("check", "--base-url", f"http://127.0.0.1:{port}/v1", "--json", timeout=60)
    assert f"cannot reach http://127.0.0.1:{port}/v1: connection refused" in one_line_exit_2(res)
    assert json.loads(res.stdout) == {"verdict": "unusable", "exit_code": 2, "error": res.stderr.strip()
                                      .removeprefix("error: "), "findings": []}


def test_nothing_to_audit_is_exit_2_in_one_line():
    assert "give a scenario file or --base-url" in one_line_exit_2(run_cli("check", timeout=60))


def test_validate_says_it_sends_nothing_and_points_to_check():
    res = run_cli("validate", "--help", timeout=60)
    assert "without sending anything" in res.stdout and "loadgen check" in res.stdout


# ---- each server's finding, held to its ground truth (in process) ------------------------------------------
def test_a_response_cache_is_a_finding_and_nothing_else_is(servers):
    result = check(servers, "cache")
    assert statuses(result) == all_ok_but(caching=FINDING, metrics_endpoint=INFO)
    assert result.exit_code == 1 and result.verdict == "findings"
    ev = result.finding("caching").evidence
    assert ev["repeated_same_text"] and ev["repeated_decode_ms_p50"] == 0.0  # the whole answer in one write
    assert ev["repeated_e2e_ms_p50"] < 0.3 * ev["fresh_e2e_ms_p50"]


def test_a_role_only_first_chunk_long_before_the_first_token_is_a_finding(servers):
    before = len(servers.log)
    result = check(servers, "role-first")
    assert statuses(result) == all_ok_but(first_chunk=FINDING, metrics_endpoint=INFO)
    ev = result.finding("first_chunk").evidence
    assert ev["first_chunk_has_token"] is False
    written = [e for e in servers.log[before:] if e["max_tokens"] == PROBE_OUTPUT_TOKENS]
    truth_ms = statistics.median((e["t_first_token_ns"] - e["t_first_event_ns"]) / 1e6 for e in written)
    assert abs(ev["first_chunk_lead_ms_p50"] - truth_ms) < TIMING_TOLERANCE_MS
    lead = f"comes {ev['first_chunk_lead_ms_p50']:.0f} ms before the first token"
    assert lead in result.finding("first_chunk").summary


def test_usage_that_misreports_both_counts_is_two_findings_and_not_coalescing(servers):
    result = check(servers, "usage-lies")
    assert statuses(result) == all_ok_but(usage=FINDING, tokenizer=FINDING, metrics_endpoint=INFO)
    assert result.limits() == ["usage", "tokenizer"]
    assert result.finding("usage").evidence["completion_tokens"] == [PROBE_OUTPUT_TOKENS * LIE_FACTOR] * 3
    tok = result.finding("tokenizer").evidence
    assert [r - c for r, c in zip(tok["prompt_tokens_reported"], tok["prompt_tokens_counted"])] == [PROMPT_LIE] * 3
    assert result.finding("coalescing").evidence["tokens_per_chunk"] == 1.0  # judged on max_tokens, not usage


def test_a_stream_without_usage_is_a_finding_and_the_tokenizer_line_says_why_it_cannot_judge(servers):
    result = check(servers, "no-usage")
    assert statuses(result) == all_ok_but(usage=FINDING, tokenizer=INFO, metrics_endpoint=INFO)
    assert result.exit_code == 1 and result.finding("usage").evidence["completion_tokens"] == [None] * 3
    assert "no usage in the stream" in result.finding("usage").summary
    assert result.finding("tokenizer").summary == "no usage.prompt_tokens to check against the tokenizer"


def test_http_1_0_gzip_and_close_delimited_answers_are_measured_and_said(servers):
    """HTTP/1.0, gzip although identity was asked, each body ending at the close (RFC 9112 §6.3 rule 8): the
    answers still stream token by token (streaming, coalescing, buffering ok); the http, compression and
    keep_alive lines say what the server does; none limits what can be measured (exit 0)."""
    result = check(servers, "http10")
    assert statuses(result) == all_ok_but(http=INFO, compression=INFO, keep_alive=INFO, metrics_endpoint=INFO)
    assert result.exit_code == 0
    assert result.finding("http").evidence["http_version"] == "1.0"
    assert result.finding("compression").evidence["content_encoding"] == ["gzip"]
    alive = result.finding("keep_alive").evidence
    assert alive["closing_answers"] == alive["answers"] > 1


# ---- the pure judgement, as a run's records would feed it ---------------------------------------------------
def answer(stamps_ms: list[float], tokens: int, e2e_ms: float) -> ChunkTimes:
    return ChunkTimes(tuple(int(t * 1e6) for t in stamps_ms), tokens, 0, int(e2e_ms * 1e6))


def test_coalescing_is_tokens_per_chunk_and_its_limit_is_the_chunk_gap():
    spaced = [answer([20 + 10 * i for i in range(8)], 8, 100)]
    assert coalescing(spaced).status == OK
    coalesced = coalescing([answer([20 + 30 * i for i in range(4)], 12, 120)])
    assert coalesced.status == FINDING and coalesced.evidence["tokens_per_chunk"] == 3.0
    assert "ITL below 30 ms is not measurable" in coalesced.summary
    assert coalescing([answer([], 0, 10)]).status == INFO


def test_buffering_is_chunks_per_read_or_content_squeezed_into_the_end():
    assert buffering([answer([20 + 10 * i for i in range(8)], 8, 100)]).status == OK
    burst = buffering([answer([99.0] * 8, 8, 100)])  # every chunk in one read, at the end
    assert burst.status == FINDING and burst.evidence["chunks_per_read"] == 8.0
    squeezed = buffering([answer([1000 + 0.1 * i for i in range(8)], 8, 1001)])
    assert squeezed.status == FINDING and squeezed.evidence["reads"] == 8
    # a long prompt queued for a minute: its 64 tokens, 10 ms apart, are 1 % of the answer's time, and not buffered
    assert buffering([answer([59_000 + 10 * i for i in range(64)], 64, 59_700)]).status == OK


def probe(ttft_ms: float, decode_ms: float, text: str = "t", cached: int | None = None) -> Probe:
    content = tuple(int((ttft_ms + decode_ms * i / 7) * 1e6) for i in range(8))
    return Probe(200, None, 0, content[-1] + 1_000_000, content[0], True, content, 8, 8, 10, cached, "length", text)


def test_caching_tells_a_response_cache_from_a_prefix_cache():
    fresh = [probe(50, 70), probe(52, 70), probe(51, 71)]
    assert caching([probe(50, 70), probe(1, 0), probe(1, 0)], fresh).status == FINDING
    prefix = caching([probe(50, 70), probe(10, 70, cached=96), probe(11, 70, cached=96)], fresh)
    assert prefix.status == INFO and "prefix cache" in prefix.summary
    assert caching([probe(50, 70), probe(51, 70), probe(50, 71)], fresh).status == OK


def test_the_verdict_maps_the_worst_line_to_the_exit_code():
    from loadgen.analysis.check_findings import FAIL, Finding

    def of(*states: str) -> tuple[str, int]:
        return verdict([Finding(f"l{i}", s, "") for i, s in enumerate(states)])
    assert of(OK, INFO) == ("clean", 0) and of(OK, FINDING, INFO) == ("findings", 1)
    assert of(FINDING, FAIL) == ("cannot measure", 2) and of() == ("clean", 0)


# ---- the same signs in a run's own records ----------------------------------------------------------------
RUN = """\
name: signs
target: {base_url: embedded}
load: {arrival: constant, rate_per_s: 20, requests: 8, drain_timeout_s: 5}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 64}, output_tokens: {dist: fixed, value: 16}}]
"""


@pytest.mark.parametrize("kind", ["coalesce", "usage-lies", "clean"])
def test_a_run_says_when_its_records_show_coalesced_tokens_or_lying_usage(servers, tmp_path, kind):
    """The run's own records, judged by check's rule: in run.json, summary.json, summary.md and report.html;
    never the verdict (both runs pass)."""
    path = tmp_path / "signs.yaml"
    path.write_text(RUN)
    out = tmp_path / kind
    result = api.run(api.load_scenario(path), base_url=servers.url(kind), out=out, server_metrics=False)
    assert result.verdict == "pass", result.reasons
    names = [f["name"] for f in result.findings]
    run_json = json.loads((out / "run.json").read_text())
    assert [f["name"] for f in run_json["findings"]] == names
    assert [f["name"] for f in json.loads((out / "summary.json").read_text())["findings"]] == names
    if kind == "clean":
        assert names == [] and "Finding:" not in (out / "summary.md").read_text()
        return
    if kind == "usage-lies":  # 3 x 16 reported for 16 generated (finish_reason length)
        assert names == ["usage"] and "usage.completion_tokens 48, possible 16..16" in \
            result.findings[0]["summary"]  # a run's records keep their own count, the claim in usage_rejected
        return
    assert names == ["coalescing"]
    assert result.findings[0]["evidence"]["tokens_per_chunk"] == COALESCE
    assert f"Finding: the server coalesces tokens ({COALESCE:.1f} per chunk)" in (out / "summary.md").read_text()
    html = (out / "report.html").read_text()
    assert f'<p class="finding">Finding: the server coalesces tokens ({COALESCE:.1f} per chunk)' in html
