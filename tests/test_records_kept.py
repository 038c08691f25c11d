"""Records are never lost: whatever raises in the sink, the driver or the analysis, every request the server
received has its row; bad datasets are exit 2 before anything is sent; a run whose first requests all fail stops
with the server's message and keeps the evidence (--capture); the Locust driver records a request whose body
cannot be built."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from loadgen import api
from loadgen.core.tracker import StreamTracker
from loadgen.plan.schedule import build_plan
from loadgen.records import sink as sinks
from tests.conftest import scenario_file
from tests.run_helpers import run_cli, summary
from tests.shape_server import FAIL_COOKIE, ShapeServer

SCENARIO = """\
name: kept
target: {base_url: embedded, ttft_timeout_s: 10}
load: {arrival: constant, rate_per_s: 20, requests: 40, duration_s: 10, drain_timeout_s: 5}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 16}, output_tokens: {dist: fixed, value: 4}}]
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    return scenario_file(tmp_path, SCENARIO, "kept.yaml")


def rows_match_the_server(out: Path, shapes: ShapeServer, before: int) -> pl.DataFrame:
    requests = pl.read_parquet(out / "requests.parquet")
    received = shapes.log[before:]
    assert requests.height == len(received) and requests["seq"].n_unique() == requests.height
    return requests


# ---- injected faults: the sink, the driver, the analysis ------------------------------------------------------
def test_a_flush_that_raises_keeps_every_record_for_the_next(shapes, scenario, tmp_path, monkeypatch):
    real, calls = sinks.write_atomic, []

    def failing_once(files):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected: the first flush fails")
        return real(files)
    monkeypatch.setattr(sinks, "write_atomic", failing_once)
    before = len(shapes.log)
    result = api.run(api.load_scenario(scenario), base_url=shapes.url("ok"), out=tmp_path / "r",
                     server_metrics=False)
    assert len(calls) >= 2 and result.exit_code == 0  # the run went on; the next flush wrote them all
    assert rows_match_the_server(tmp_path / "r", shapes, before).height == 40


def test_a_fault_adding_a_record_to_the_sink_still_leaves_its_row(shapes, scenario, tmp_path, monkeypatch):
    """The sink's add raises for one request (a bug): that request keeps its row, as error internal (exit 4),
    and the buffer's columns stay in step for every other row."""
    real = sinks.RecordSink.add

    def faulty(self, record, chunks):
        if record.seq == 5 and chunks:
            chunks = [*chunks, object()]  # not a chunk record: raises while the row is being built
        return real(self, record, chunks)
    monkeypatch.setattr(sinks.RecordSink, "add", faulty)
    before = len(shapes.log)
    result = api.run(api.load_scenario(scenario), base_url=shapes.url("ok"), out=tmp_path / "r",
                     server_metrics=False)
    requests = rows_match_the_server(tmp_path / "r", shapes, before)
    bad = requests.filter(pl.col("seq") == 5)
    assert bad["error_kind"].to_list() == ["internal"] and "AttributeError" in bad["error_message"][0]
    assert requests["error_kind"].null_count() == 39 and result.exit_code == 4
    chunks = pl.read_parquet(tmp_path / "r" / "chunks.parquet")
    assert chunks.filter(pl.col("seq") == 5).height == 0 and chunks["seq"].n_unique() == 39


def test_a_record_with_a_value_past_its_column_still_has_its_row(tmp_path):
    from tests.test_sinks import _record

    sink = sinks.RecordSink(tmp_path)
    sink.add(*_record(1))
    bad, chunks = _record(2)
    bad.output_tokens_asked = 10 ** 30  # past Int64: the flush used to fail and (not an OSError) lose them all
    sink.add(bad, chunks)
    sink.close()
    requests = pl.read_parquet(tmp_path / "requests.parquet")
    assert requests["seq"].to_list() == [1, 2] and requests["output_tokens_asked"].to_list()[1] is None


@pytest.mark.parametrize("stage", ["finish", "feed"])
def test_a_fault_in_the_driver_is_a_counted_internal_error_and_exit_4(shapes, scenario, tmp_path, monkeypatch,
                                                                         stage):
    real = getattr(StreamTracker, stage)

    def faulty(self, *args, **kwargs):
        if self.meta.seq == 3:
            raise TypeError(f"injected into {stage}")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(StreamTracker, stage, faulty)
    before = len(shapes.log)
    result = api.run(api.load_scenario(scenario), base_url=shapes.url("ok"), out=tmp_path / "r",
                     server_metrics=False)
    requests = rows_match_the_server(tmp_path / "r", shapes, before)
    bad = requests.filter(pl.col("seq") == 3)
    assert bad["error_kind"].to_list() == ["internal"] and f"injected into {stage}" in bad["error_message"][0]
    assert requests["error_kind"].null_count() == 39
    assert result.exit_code == 4 and result.verdict == "inconclusive"
    assert any("bug in loadgen" in r for r in result.reasons)


def test_a_fault_in_the_analysis_leaves_every_record_on_disk(shapes, scenario, tmp_path, monkeypatch):
    from loadgen.run import reporting

    def broken(*args, **kwargs):
        raise ZeroDivisionError("injected into the analysis")
    monkeypatch.setattr(reporting, "summarize", broken)
    before = len(shapes.log)
    with pytest.raises(ZeroDivisionError):
        api.run(api.load_scenario(scenario), base_url=shapes.url("ok"), out=tmp_path / "r", server_metrics=False)
    assert rows_match_the_server(tmp_path / "r", shapes, before)["error_kind"].null_count() == 40


def test_a_bug_while_preparing_a_body_is_internal_not_the_servers(shapes, scenario, tmp_path, monkeypatch):
    """A server's refusal to count a prompt is its error (``protocol``, below); any other exception while a body
    is built is loadgen's bug: the request's row says ``internal``, the others go on, and the exit code is 4."""
    from loadgen.run import prepare

    real = prepare.Prepared.body

    async def broken_for_seq_7(self, req, prompt=None):
        if req.seq == 7:
            raise ZeroDivisionError("injected into the body build")
        return await real(self, req, prompt)
    monkeypatch.setattr(prepare.Prepared, "body", broken_for_seq_7)
    before = len(shapes.log)
    result = api.run(api.load_scenario(scenario), base_url=shapes.url("ok"), out=tmp_path / "r",
                     server_metrics=False)
    requests = pl.read_parquet(tmp_path / "r" / "requests.parquet")
    assert requests.height == 40 and len(shapes.log) - before == 39  # seq 7 was never sent, yet has its row
    bad = requests.filter(pl.col("seq") == 7).row(0, named=True)
    assert bad["error_kind"] == "internal" and "ZeroDivisionError: injected into the body build" in bad["error_message"]
    assert requests.filter(pl.col("seq") != 7)["error_kind"].null_count() == 39 and result.exit_code == 4


# ---- fail fast, with the evidence ---------------------------------------------------------------------------
def test_a_server_that_fails_everything_stops_the_run_with_its_message(shapes, scenario, tmp_path):
    """40 planned; the first 10 to end all fail (HTTP 500): the run stops there, exit 1, the server's message
    on the console and in the summary, the first 3 responses kept raw in captures/."""
    out = tmp_path / "r"
    before = len(shapes.log)
    res = run_cli("run", str(scenario), "--base-url", shapes.url("fail"), "--out", str(out), "--no-progress",
                  "--no-png", "--capture", "3", timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    reason = ("stopped early: the first 10 requests all failed (load.fail_fast_requests); the first: http_5xx "
              "(HTTP 500): the model is not loaded")
    assert reason in res.stdout
    requests = rows_match_the_server(out, shapes, before)
    assert 10 <= requests.height < 20  # not the 40 planned
    s = summary(out)
    assert reason in s["notes"] and reason in s["reasons"] and s["verdict"] == "fail"
    captures = sorted((out / "captures").iterdir())
    assert [p.name[:4] for p in captures] == ["001-", "002-", "003-"]
    text = captures[0].read_text()
    assert "HTTP/1.1 500 Internal Server Error" in text and "the model is not loaded" in text
    assert "set-cookie: ***" in text and all(FAIL_COOKIE not in p.read_text() for p in captures)  # redacted


def test_a_minute_long_run_against_a_failing_server_ends_within_seconds(shapes, tmp_path):
    """A run planned for 60 s at 20 req/s (1,200 requests) against a server that fails every request: the
    records end within 5 s of the first send (the first 10 failures, ~0.5 s, plus what was in flight), with the
    server's message as the reason, not after the minute."""
    assert "requests: 40, duration_s: 10" in SCENARIO
    path = scenario_file(tmp_path, SCENARIO.replace("requests: 40, duration_s: 10", "duration_s: 60"), "min.yaml")
    sc = api.load_scenario(path)
    assert build_plan(sc).size >= 1200  # 60 s at 20 req/s planned (constant arrivals: both ends included)
    result = api.run(sc, base_url=shapes.url("fail"), out=tmp_path / "r", server_metrics=False)
    requests = pl.read_parquet(tmp_path / "r" / "requests.parquet")
    span_s = (requests["t_done_ns"].max() - requests["t_intended_ns"].min()) / 1e9  # type: ignore[operator]
    assert result.exit_code == 1 and requests.height < 100 and span_s < 5.0, (requests.height, span_s)
    assert any("the model is not loaded" in note for note in result.notes), result.notes


@pytest.mark.slow
def test_fail_fast_is_off_with_no_fail_fast(shapes, scenario, tmp_path):
    out = tmp_path / "r"
    before = len(shapes.log)
    res = run_cli("run", str(scenario), "--base-url", shapes.url("fail"), "--out", str(out), "--no-progress",
                  "--no-png", "--no-fail-fast", timeout=120)
    assert res.returncode == 1 and rows_match_the_server(out, shapes, before).height == 40


# ---- the Locust driver: a body that cannot be built ---------------------------------------------------------
@pytest.mark.slow
def test_locust_records_a_request_whose_prompt_cannot_be_counted_and_ends(shapes, scenario, tmp_path):
    """14: under Locust each prompt is counted on /tokenize when it is sent; /tokenize fails mid-run. Each such
    request is a record (it hung the run forever), and the fail-fast guard ends it."""
    out = tmp_path / "r"
    before = len(shapes.log)
    res = run_cli("run", str(scenario), "--engine", "locust", "--base-url", shapes.url("tokenize-fails"), "--out",
                  str(out), "--no-progress", "--no-png", timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    requests = pl.read_parquet(out / "requests.parquet")
    failed = requests.filter(pl.col("error_kind") == "protocol")
    assert failed.height >= 10 and requests["seq"].n_unique() == requests.height
    # every request the server received has its own row, with its own answer; the failed ones were never sent
    received = {e["id"]: e for e in shapes.log[before:]}
    answered = requests.filter(pl.col("error_kind").is_null())
    assert answered.height == len(received) and set(answered["request_id"]) == set(received)
    for row in answered.iter_rows(named=True):
        assert row["output_tokens"] == row["chunks"] == received[row["request_id"]]["max_tokens"]
    assert failed["request_id"].null_count() == failed.height
    assert (failed["t_sent_ns"] == failed["t_intended_ns"]).all()  # never sent: no queue delay, no lag
    assert all(m.startswith("the request could not be prepared: TargetError:") and "tokenizer crashed" in m
               for m in failed["error_message"])
    assert requests.filter(pl.col("error_kind") == "internal").is_empty()  # the server's fault, not loadgen's


@pytest.mark.parametrize("shape", ["tokenize-fails", "tokenize-reshaped"])
def test_a_tokenize_endpoint_that_fails_while_the_prompts_are_built_is_exit_2(shapes, scenario, tmp_path, shape):
    """The asyncio driver builds an open loop's prompts before the first send: /tokenize refusing (500) or
    answering without its count there is the server's fault before any load — exit 2 in one line, nothing sent."""
    before = len(shapes.log)
    res = run_cli("run", str(scenario), "--base-url", shapes.url(shape), "--out", str(tmp_path / "r"),
                  "--no-progress", "--no-png", timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "/tokenize" in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert len(shapes.log) == before  # no generation request was sent


def test_a_tokenize_answer_without_its_count_is_the_servers_fault():
    """Mid-run, /tokenize answers 200 in another shape: a ServerFault (counted ``protocol``), not a KeyError that
    would read as loadgen's bug."""
    import asyncio

    from loadgen.drivers.timing import preparation_error
    from loadgen.plan.workload import ServerFault, TokenizeEndpointCounter

    async def post(path, body):
        return {"tokens": [1, 2, 3]}  # no "count"
    with pytest.raises(ServerFault) as err:
        asyncio.run(TokenizeEndpointCounter(post, "m", "chat").count(None, "hello"))
    assert "/tokenize answered without what loadgen reads (KeyError: 'count')" in str(err.value)
    assert preparation_error(err.value)[0] == "protocol"
    assert preparation_error(KeyError("count"))[0] == "internal"


# ---- datasets: exit 2 naming the record, or read whole ------------------------------------------------------
def dataset_scenario(tmp_path: Path, name: str, content: str | bytes, **dataset: object) -> Path:
    data = tmp_path / name
    data.write_bytes(content.encode() if isinstance(content, str) else content)
    spec = {"path": name, **dataset}
    path = tmp_path / "ds.yaml"
    path.write_text(f"name: ds\nload: {{arrival: constant, rate_per_s: 1, requests: 3}}\nworkload:\n  classes: "
                    f"[{{name: d, dataset: {json.dumps(spec)}}}]\n")
    return path


def test_a_csv_field_over_128_kib_is_a_prompt_like_any_other(tmp_path):
    prompt = "word " * 40_000  # 200 KB: the csv module's default limit is 128 KiB
    path = dataset_scenario(tmp_path, "long.csv", f"prompt,answer\n\"{prompt}\",12\n", output_column="answer")
    plan = build_plan(api.load_scenario(path))
    assert plan.size == 3 and {r.output_tokens for r in plan.requests} == {12}


@pytest.mark.parametrize("name, content, dataset, message", [
    ("bad.jsonl", '{"prompt": "a"}\n{"prompt": \n', {}, "dataset {path}: not valid jsonl: line 2: Expecting value"),
    ("msgs.csv", 'messages\n"[{""role"": ""user"""\n', {"messages_column": "messages"},
     "dataset {path}: record 1: messages is not JSON"),
    ("nan.jsonl", '{"prompt": "a b", "n": NaN}\n', {"output_column": "n"},
     "dataset {path}: record 1: n = nan is not an answer length"),
    ("huge.jsonl", '{"prompt": "a b", "n": 1e30}\n', {"output_column": "n"},
     "dataset {path}: record 1: n = 1e+30 is not an answer length"),
    ("big.csv", 'prompt,n\na b,99999999999999999999\n', {"output_column": "n"},
     "dataset {path}: record 1: n = 99999999999999999999 is not an answer length"),
])
def test_a_bad_dataset_value_is_exit_2_naming_the_record(tmp_path, name, content, dataset, message):
    path = dataset_scenario(tmp_path, name, content, **dataset)
    with pytest.raises(api.ScenarioError) as caught:
        build_plan(api.load_scenario(path))
    assert str(caught.value).startswith(message.format(path=tmp_path / name)), str(caught.value)
    if name == "nan.jsonl":  # and so through the command line: one line, exit 2, before anything is sent
        res = run_cli("validate", str(path), timeout=60)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_empirical_files_inside_mixtures_and_conversations_are_relative_to_the_scenario(tmp_path):
    (tmp_path / "lengths.txt").write_text("7\n7\n")
    (tmp_path / "turns.txt").write_text("2\n")
    path = tmp_path / "mix.yaml"
    mixture = ("{dist: mixture, components: [{weight: 1, dist: {dist: empirical, file: lengths.txt}}, "
               "{weight: 1, dist: {dist: empirical, file: lengths.txt}}]}")
    path.write_text(f"name: mix\nload: {{arrival: constant, rate_per_s: 1, requests: 4}}\nworkload:\n  classes:\n"
                    f"  - {{name: a, prompt_tokens: {mixture}, output_tokens: {mixture}}}\n"
                    f"  - {{name: b, prompt_tokens: {{dist: fixed, value: 5}}, output_tokens: {{dist: fixed, value: 3}},"
                    f" conversation: {{turns: {{dist: empirical, file: turns.txt, max: 4}}}}}}\n")
    plan = build_plan(api.load_scenario(path))  # the working directory is the repository's, not tmp_path
    assert {r.prompt_tokens for r in plan.requests if r.class_name == "a"} == {7}
    assert {r.turn for r in plan.requests if r.class_name == "b"} <= {0, 1} and not math.isnan(plan.size or 0)


def test_requests_cut_at_the_runs_end_are_not_captured(shapes, scenario, tmp_path):
    """--capture keeps failed responses: a request cancelled at the run's hard end (the server was answering
    well, only slowly) is not one, and takes no capture's place."""
    sc = api.load_scenario(scenario, {"load.drain_timeout_s": 0.2})
    result = api.run(sc, base_url=shapes.url("slow-first"), out=tmp_path / "r", server_metrics=False, capture=5)
    assert result.requests["cancelled"] > 0
    assert not (tmp_path / "r" / "captures").exists()
