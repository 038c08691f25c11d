"""The OpenAI Responses API, Anthropic's Messages API and embeddings: parsed from canned events, and each run
against the simulator, whose trace is the truth for what it sent and when."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from local_target.sim import read_trace
from loadgen import api
from loadgen.core import RequestMeta, StreamTracker
from loadgen.core.apis import parse_anthropic_event, parse_responses_event
from loadgen.plan.scenario_file import load_scenario
from loadgen.run.target import auth_headers
from tests.run_helpers import records, trace_per_request


def _scenario(tmp_path: Path, target_api: str, **cls) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": target_api, "seed": 4, "target": {"api": target_api, "simulator": {"prefix_caching": True, "trace": True}},
        "load": {"arrival": "poisson", "rate_per_s": 8, "requests": 24},
        "workload": {"classes": [{"name": "a", "prompt_tokens": {"dist": "uniform", "min": 200, "max": 400},
                                  "output_tokens": {"dist": "fixed", "value": 12}, "shared_prefix_tokens": 96,
                                  **cls}]}}))
    return path


def _tracked(target_api: str, events: list[dict]) -> tuple:
    tracker = StreamTracker(RequestMeta(0, "a", False, 0, 5, 3), 1, api=target_api)
    for n, e in enumerate(events):
        tracker.feed(f"event: {e.get('type')}\ndata: {json.dumps(e)}\n\n".encode(), 10 + n)
    return tracker.finish(100)


# ---- parsing --------------------------------------------------------------------------------------------
def test_a_responses_stream_gives_text_usage_and_its_end():
    usage = {"input_tokens": 5, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 2}}
    record, chunks = _tracked("responses", [
        {"type": "response.created", "response": {"id": "r1", "usage": None}},
        *({"type": "response.output_text.delta", "delta": w} for w in (" a", " b", " c")),
        {"type": "response.completed", "response": {"id": "r1", "usage": usage}}])
    assert [c.t_ns for c in chunks] == [11, 12, 13] and sum(c.tokens for c in chunks) == 3
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens, record.finish_reason,
            record.error_kind, record.request_id) == (5, 3, 2, "stop", None, "r1")


def test_a_responses_failure_and_an_anthropic_error_event_are_counted_errors():
    record, _ = _tracked("responses", [{"type": "response.failed", "response": {"error": {"message": "boom"}}}])
    assert record.error_kind == "protocol" and "boom" in record.error_message
    record, _ = _tracked("messages", [{"type": "error", "error": {"type": "overloaded_error",
                                                                  "message": "Overloaded"}}])
    assert record.error_kind == "protocol" and record.error_message == "Overloaded"


def test_an_anthropic_stream_counts_cache_reads_in_the_prompt():
    start = {"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 3, "output_tokens": 1,
                                                                        "cache_read_input_tokens": 40}}}
    record, chunks = _tracked("messages", [
        start, {"type": "content_block_start", "index": 0},
        *({"type": "content_block_delta", "delta": {"type": "text_delta", "text": w}} for w in (" x", " y")),
        {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"}])
    assert (record.prompt_tokens, record.cached_tokens, record.output_tokens, record.finish_reason) == \
        (43, 40, 2, "length")
    assert len(chunks) == 2 and record.error_kind is None


def test_a_stream_cut_before_its_end_event_is_a_protocol_error():
    record, _ = _tracked("messages", [{"type": "message_start", "message": {"id": "m"}},
                                      {"type": "content_block_delta", "delta": {"text": "x"}}])
    assert record.error_kind == "protocol" and "without" in record.error_message
    assert parse_responses_event("{nope").error and parse_anthropic_event("[1]").error


def test_an_embeddings_answer_without_vectors_is_an_error():
    tracker = StreamTracker(RequestMeta(0, "a", False, 0, 5, 0), 1, api="embeddings")
    tracker.feed(b'{"data": [], "usage": {"prompt_tokens": 5}}', 5)
    assert tracker.finish(6)[0].error_kind == "protocol"


def test_the_messages_api_authenticates_with_x_api_key(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADGEN_TEST_KEY", "sk-ant-secret")
    path = _scenario(tmp_path, "messages")
    scenario = load_scenario(path, ["target.api_key_env=LOADGEN_TEST_KEY"])
    headers, _ = auth_headers(scenario)
    assert headers["x-api-key"] == "sk-ant-secret" and headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers


# ---- runs against the simulator -------------------------------------------------------------------------
@pytest.mark.timing
@pytest.mark.parametrize("target_api", ["responses", "messages"])
def test_a_streamed_api_is_measured_against_the_truth(tmp_path, target_api):
    result = api.run(load_scenario(_scenario(tmp_path, target_api)), out=tmp_path / "run")
    assert result.requests["completed"] == 24 and result.verdict == "pass", result.reasons
    requests, chunks = records(tmp_path / "run")
    assert (requests["prompt_tokens"] == requests["prompt_tokens_asked"]).all()
    assert set(requests["output_tokens"].to_list()) == {12}
    assert chunks.group_by("seq").agg(pl.col("tokens").sum())["tokens"].to_list() == [12] * 24
    # the system prompt (96 tokens of a shared prefix) is found in the simulator's prefix cache after the first
    assert requests.sort("seq")["cached_tokens"][1:].min() >= 80
    truth = trace_per_request(tmp_path / "run")
    errors = [(row["t_first_token_ns"] - row["t_sent_ns"]) / 1e6
              - (truth[row["request_id"]]["tokens"][0][1] - truth[row["request_id"]]["arrival"]) / 1e6
              for row in requests.iter_rows(named=True)]
    assert sorted(errors)[len(errors) // 2] == pytest.approx(0, abs=1.0)


@pytest.mark.timing
def test_embeddings_latency_is_the_prefill_and_throughput_counts_prompt_tokens(tmp_path):
    result = api.run(load_scenario(_scenario(tmp_path, "embeddings")), out=tmp_path / "run")
    assert result.requests["completed"] == 24 and result.metrics["ttft_ms"]["count"] == 0
    requests, chunks = records(tmp_path / "run")
    assert chunks.is_empty() and set(requests["output_tokens"].to_list()) == {0}
    assert (requests["prompt_tokens"] == requests["prompt_tokens_asked"]).all()
    assert result.throughput["prompt_tokens_per_s"] == pytest.approx(
        requests["prompt_tokens"].sum() / result.window_s)
    trace = read_trace(tmp_path / "run" / "sim_trace.jsonl")  # the prefill's end is the answer's (modelled) time
    arrival = {e["id"]: e["t_arrival_ns"] for e in trace if e["type"] == "request"}
    done = {e["id"]: e["t_ns"] for e in trace if e["type"] == "finish"}
    errors = sorted((r["t_done_ns"] - r["t_sent_ns"]) / 1e6 - (done[r["request_id"]] - arrival[r["request_id"]]) / 1e6
                    for r in requests.iter_rows(named=True) if r["request_id"] in done)
    assert len(errors) == 24 and errors[12] == pytest.approx(0, abs=1.0)


@pytest.mark.parametrize("target_api", ["responses", "messages"])
def test_conversations_over_the_other_apis_carry_their_history(tmp_path, target_api):
    path = _scenario(tmp_path, target_api, conversation={"turns": {"dist": "fixed", "value": 3},
                                                         "think_time_s": 0.05})
    result = api.run(load_scenario(path, ["load.requests=4"]), out=tmp_path / "run")
    assert result.requests["completed"] == 12, result.reasons
    requests, _ = records(tmp_path / "run")
    for _, turns in requests.sort("turn").group_by("conversation"):
        prompts = turns["prompt_tokens"].to_list()
        assert prompts[1] > prompts[0] + 12 and prompts[2] > prompts[1] + 12  # history + answers received
        assert min(turns["cached_tokens"][1:].to_list()) >= prompts[0] - 16
