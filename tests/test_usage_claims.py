"""Usage is the server's claim (docs/servers.md, "Usage is a claim"): a count no answer can hold — over what was
asked and received, negative, a number too large for the records — never crashes a run, never makes a figure
negative or bound only by memory, and is replaced by loadgen's own count with one finding saying so; an integral
float (``16.0``, a JSON number like any other: RFC 8259 §6) is a count. Also: ``finish_reason: length`` before
max_tokens is no coalescing nor misreported usage; ``n`` > 1 is refused before any load and a stream of several
choices is an error, never one merged stream; nothing after ``[DONE]`` is counted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterator

import h11
import pytest
from hypothesis import given, settings, strategies as st

from loadgen import api
from loadgen.core.tracker import RequestMeta, StreamTracker
from loadgen.drivers.fast_parse import parse_chunk
from loadgen.records.schema import chunks_frame, requests_frame
from loadgen.run.check import builtin_scenario
from tests.check_servers import AFTER_DONE, CheckServer, count
from tests.loop_server import LoopServer, read_request
from tests.run_helpers import run_cli
from tests.shape_server import SSE_HEAD, _json, chunk, content_delta, event

ASKED = 16  # max_tokens of every generation request here
PARSERS = {"core": None, "fast": parse_chunk}  # the tracker's default parser and the run's hot-path one


def output_bound(asked: int, chars: int, chunks: int) -> int:
    """docs/servers.md: the max_tokens asked (the chunks where there were more), else 4 × characters + chunks + 16."""
    return max(asked, chunks) if asked > 0 else 4 * chars + chunks + 16


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def track(events: list[bytes], parser: str = "core", prompt_asked: int = 300, asked: int = ASKED,
          body_bytes: int | None = None) -> tuple[Any, list[Any], StreamTracker]:
    meta = RequestMeta(0, "c", False, 0, prompt_asked, asked)
    meta.body_bytes = body_bytes
    tracker = StreamTracker(meta, 1, parse=PARSERS[parser])
    for n, data in enumerate(events):
        tracker.feed(data, 10 + n)
    record, chunks = tracker.finish(1_000)
    return record, chunks, tracker


# ---- the rule, over every value a server may put in usage ---------------------------------------------------
def usage_values() -> st.SearchStrategy[Any]:
    whole_floats = st.floats(-1e6, 1e6).map(float.__floor__).map(float)  # 16.0: a count
    return st.one_of(st.integers(-2**70, 2**70), st.sampled_from([2**64, 2**63, 2**31, 20_000_000, -1, 0, 16]),
                     st.floats(allow_nan=True, allow_infinity=True), whole_floats, st.text(max_size=5), st.none(),
                     st.booleans())


@settings(max_examples=150, deadline=None)
@given(words=st.lists(st.sampled_from(["a", " b", " héllo", " 汉字", "!"]), min_size=0, max_size=12),
       final=st.fixed_dictionaries({}, optional={k: usage_values() for k in ("completion_tokens", "prompt_tokens")}),
       cached=usage_values(), reasoning=usage_values(), running=st.lists(usage_values(), max_size=12),
       parser=st.sampled_from(sorted(PARSERS)))
def test_every_usage_claim_leaves_counts_within_what_was_asked_and_received(words, final, cached, reasoning,
                                                                            running, parser):
    events = []
    for i, text in enumerate(words):
        body: dict[str, Any] = {"id": "c1", "choices": [{"index": 0, "delta": {"content": text}}]}
        if i < len(running):  # vLLM's continuous usage stats: a running count, a claim too
            body["usage"] = {"completion_tokens": running[i]}
        events.append(sse(body))
    usage = {**final, "prompt_tokens_details": {"cached_tokens": cached},
             "completion_tokens_details": {"reasoning_tokens": reasoning}}
    events += [sse({"id": "c1", "choices": [], "usage": usage}), b"data: [DONE]\n\n"]
    record, chunks, _ = track(events, parser, body_bytes=2_000)
    chars, n = sum(len(w) for w in words), len(chunks)
    high = output_bound(ASKED, chars, n)
    assert (1 if n else 0) <= record.output_tokens <= high
    assert all(c.tokens >= 1 for c in chunks) and sum(c.tokens for c in chunks) <= high
    assert record.prompt_tokens is not None and 0 <= record.prompt_tokens <= 2_000 + 1024
    assert record.cached_tokens is None or 0 <= record.cached_tokens <= record.prompt_tokens
    assert record.reasoning_tokens is None or 0 <= record.reasoning_tokens <= record.output_tokens
    claim = final.get("completion_tokens")
    taken = isinstance(claim, (int, float)) and not isinstance(claim, bool) and claim == claim \
        and abs(claim) != float("inf") and int(claim) == claim and n <= claim <= high
    if taken:
        assert (record.output_tokens, record.output_tokens_source) == (int(claim), "server")
    if record.usage_rejected is None:
        assert not isinstance(claim, int) or isinstance(claim, bool) or taken
    requests_frame([record]), chunks_frame(chunks)  # the records' Int64 columns hold every figure


@pytest.mark.parametrize("parser", sorted(PARSERS))
@pytest.mark.parametrize("claim", [2**64, 20_000_000, 2**31, -5, 200])  # 200: within the bytes, over max_tokens 16
def test_an_impossible_completion_count_keeps_the_chunks_count_and_says_why(parser, claim):
    events = [sse(content_delta("c1", f" w{i}")) for i in range(16)]
    events += [sse({"id": "c1", "choices": [], "usage": {"prompt_tokens": 1_000_000, "completion_tokens": claim}}),
               b"data: [DONE]\n\n"]
    record, chunks, _ = track(events, parser)
    assert (record.output_tokens, record.output_tokens_source) == (16, "local")
    assert [c.tokens for c in chunks] == [1] * 16  # never rescaled to the claim
    assert (record.prompt_tokens, record.prompt_tokens_source) == (300, "asked")  # 1,000,000 for ~300 asked
    assert f"usage.completion_tokens {claim}"[:30] in record.usage_rejected and "16 counted" in record.usage_rejected
    assert "usage.prompt_tokens 1000000" in record.usage_rejected


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_an_integral_float_is_a_count(parser):
    events = [sse(content_delta("c1", f" w{i}")) for i in range(8)]
    events += [sse({"id": "c1", "choices": [], "usage": {"prompt_tokens": 12.0, "completion_tokens": 16.0}}),
               b"data: [DONE]\n\n"]
    record, chunks, _ = track(events, parser)
    assert (record.output_tokens, record.output_tokens_source) == (16, "server")
    assert (record.prompt_tokens, record.prompt_tokens_source) == (12, "server")
    assert sum(c.tokens for c in chunks) == 16 and record.usage_rejected is None


# ---- several choices, and data after [DONE] -----------------------------------------------------------------
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_a_stream_of_several_choices_is_an_error_not_one_merged_stream(parser):
    events = [sse({"id": "c1", "choices": [{"index": i % 2, "delta": {"content": f" w{i}"}}]}) for i in range(8)]
    record, _, _ = track(events + [b"data: [DONE]\n\n"], parser)
    assert record.error_kind == "protocol" and "several choices" in record.error_message


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_nothing_after_done_is_counted(parser):
    events = [sse(content_delta("c1", f" w{i}")) for i in range(4)]
    events += [sse({"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}),
               b"data: [DONE]\n\n"] + [sse(content_delta("c1", " late"))] * 3
    record, chunks, tracker = track(events, parser)
    assert (record.chunks, len(chunks), record.output_tokens, record.error_kind) == (4, 4, 4, None)
    assert tracker.after_done == 3


# ---- loadgen check --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def check_server() -> Iterator[CheckServer]:
    with CheckServer() as srv:
        yield srv


def check(server: CheckServer, kind: str) -> Any:
    return api.check(builtin_scenario(lambda p: api.load_scenario(p, [f"target.base_url={server.url(kind)}"])))


def test_length_before_max_tokens_is_neither_coalescing_nor_misreported_usage(check_server):
    result = check(check_server, "early-length")
    by_name = {f.name: f for f in result.findings}
    assert by_name["coalescing"].status == "ok" and by_name["coalescing"].evidence["tokens_per_chunk"] == 1.0
    assert by_name["usage"].status == "ok", by_name["usage"].summary
    assert result.limits() == [] and result.exit_code == 0


def test_data_after_done_is_its_own_line_and_not_blamed_on_usage(check_server):
    result = check(check_server, "after-done")
    by_name = {f.name: f for f in result.findings}
    assert by_name["after_done"].status == "info" and "data after [DONE]" in by_name["after_done"].summary
    assert by_name["after_done"].evidence["events_after_done"] == AFTER_DONE * by_name["after_done"].evidence["answers"]
    assert by_name["usage"].status == "ok" and result.exit_code == 0


# ---- a run against a server that claims absurd counts ----------------------------------------------------------
CLAIMS = [2**64, 20_000_000, -5, 2**64 + 1]


class ClaimServer(LoopServer):
    """Streams 16 tokens, then usage claiming ``CLAIMS`` in turn (and 1,000,000 prompt tokens); logs each
    generation request's body."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []
        self.requests = 0  # every request, /v1/models included

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request, body = await read_request(h11.Connection(h11.SERVER), reader)
            if request is None:
                return
            path, self.requests = request.target.decode(), self.requests + 1
            if path == "/v1/models":
                _json(writer, 200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
            elif path == "/tokenize":  # vLLM's: exact prompt lengths (a word a token, as check_servers counts)
                _json(writer, 200, {"count": count(json.loads(body))})
            elif path == "/v1/chat/completions":
                req = json.loads(body)
                n = int(req.get("max_tokens", 16))
                claim = n if n <= 1 else CLAIMS[len(self.bodies) % len(CLAIMS)]
                if n > 1:
                    self.bodies.append(req)
                events = b"".join(event(content_delta("r", f" w{i}")) for i in range(n))
                usage = {"prompt_tokens": 1_000_000 if n > 1 else 8, "completion_tokens": claim}
                events += event({"id": "r", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
                events += event({"id": "r", "choices": [], "usage": usage}) + b"data: [DONE]\n\n"
                writer.write(SSE_HEAD + chunk(events) + chunk(b""))
            else:
                _json(writer, 404, {"error": {"message": f"no {path} here"}})
            await writer.drain()


RUN = """\
name: claims
target: {ttft_timeout_s: 10, idle_timeout_s: 5}
load: {arrival: constant, rate_per_s: 20, requests: 8, duration_s: 2, drain_timeout_s: 5}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 64}, output_tokens: {dist: fixed, value: 16}}]
"""


@pytest.fixture(scope="module")
def claims() -> Iterator[ClaimServer]:
    with ClaimServer() as srv:
        yield srv


def numbers(doc: Any, key: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from numbers(v, k)
    elif isinstance(doc, list):
        for v in doc:
            yield from numbers(v, key)
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield key, doc


def test_a_run_against_absurd_usage_ends_with_bounded_figures_and_one_finding(claims, tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text(RUN)
    out = tmp_path / "run"
    res = run_cli("run", str(path), "--base-url", f"http://127.0.0.1:{claims.port}/v1", "--out", str(out),
                  "--no-server-metrics", timeout=120)
    assert res.returncode != 4, res.stdout + res.stderr
    doc = json.loads((out / "summary.json").read_text())
    tokens = [(k, v) for k, v in numbers(doc) if "token" in k]
    assert tokens and all(0 <= v <= 1e6 for _, v in tokens), [t for t in tokens if not 0 <= t[1] <= 1e6]
    usage = [f for f in doc["findings"] if f["name"] == "usage"]
    assert len(usage) == 1 and "no answer can hold" in usage[0]["summary"], doc["findings"]
    assert "usage.completion_tokens" in usage[0]["summary"]


def test_n_over_1_is_refused_before_any_load_naming_the_field(claims, tmp_path):
    before = claims.requests
    for field, value in (("n", 2), ("best_of", 3)):
        res = run_cli("run", "--base-url", f"http://127.0.0.1:{claims.port}/v1", "--set",
                      f"target.extra_body={{\"{field}\": {value}}}", "--out", str(tmp_path / field), timeout=60)
        assert res.returncode == 2, res.stdout + res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and f"extra_body.{field} is {value}" in lines[0], res.stderr
        assert "one streamed answer per request" in lines[0]
    assert claims.requests == before  # nothing was sent, not even /v1/models
    assert not Path(tmp_path / "n").exists()
