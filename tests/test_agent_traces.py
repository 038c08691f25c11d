"""Agent traces read into session graphs (plan/agent_traces.py, plan/otel_trace.py): each fixture of
tests/data/agent_traces (README: the expected graphs, from the WEKA and OpenTelemetry formats' documented
schemas) gives its documented parents, contexts and waits; the schedule those imply (a call is sent when its
last parent ended plus its wait) is the fixture's; bad inputs are one line naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loadgen.cli.app import app
from loadgen.plan.agent_traces import read_agent_trace, trace_format_of
from loadgen.plan.scenario import ScenarioError
from loadgen.plan.session_spec import SessionTrace
from loadgen.plan.sessions import SessionPlan

DATA = Path(__file__).parent / "data" / "agent_traces"


def read(name: str, fmt: str, max_wait_s: float = 15.0) -> list[SessionPlan]:
    return read_agent_trace(SessionTrace(path=DATA / name, format=fmt, max_wait_s=max_wait_s))  # type: ignore[arg-type]


def sends_s(plan: SessionPlan, latency_s: float | dict[int, float] = 0.0) -> list[float]:
    """Each call's send time when every call takes ``latency_s`` (a call's own where a dict names it)."""
    sent: list[float] = []
    done: list[float] = []
    for c in plan.calls:
        ready = max((done[p] for p in c.parents), default=0.0)
        sent.append(round(ready + c.wait_ns / 1e9, 6))
        took = latency_s.get(c.call, 0.0) if isinstance(latency_s, dict) else latency_s
        done.append(sent[-1] + took)
    return sent


def graph(plan: SessionPlan) -> list[tuple[tuple[int, ...], int | None, int, str, int]]:
    return [(c.parents, c.context, round(c.wait_ns / 1e6), c.wait_kind, c.agent) for c in plan.calls]


FANOUT = [((), None, 0, "none", 0), ((0,), 0, 500, "tool", 0),  # a tool round trip
          ((1,), None, 100, "tool", 1), ((2,), 2, 200, "tool", 1),  # sub-agent 1: two calls, a tool wait
          ((1,), None, 100, "tool", 2), ((1,), None, 100, "tool", 3),  # sub-agents 2 and 3
          ((1, 3, 4, 5), 1, 300, "tool", 0),  # the join: every sub-agent's last call, then 0.3 s
          ((6,), 6, 1000, "think", 0)]  # the user's follow-up


def test_a_weka_fan_out_and_join_is_the_documented_graph_and_schedule():
    [plan] = read("7c3e9a10-f4a.json", "weka")
    assert graph(plan) == FANOUT and plan.source == "weka:7c3e9a10-f4a" and plan.block_tokens == 64
    assert [c.tool_turn for c in plan.calls] == [True, True, True, False, False, False, False, False]
    # a call adds its input less its context's input and output (640 + 64 → 832: 128 new tokens)
    assert [c.prompt_tokens for c in plan.calls] == [640, 128, 256, 96, 384, 320, 192, 64]
    # the fixture's zero-latency and 0.1-s columns (README); recorded starts are informative
    assert sends_s(plan) == [0.0, 0.5, 0.6, 0.8, 0.6, 0.6, 1.1, 2.1]
    assert sends_s(plan, 0.1) == [0.0, 0.6, 0.8, 1.1, 0.8, 0.8, 1.5, 2.6]
    assert [c.t_offset_ns / 1e9 for c in plan.calls] == [0.0, 1.5, 2.6, 3.2, 2.6, 2.6, 4.5, 6.7]


def test_the_join_waits_for_its_slowest_sub_agent_then_its_delay():
    [plan] = read("7c3e9a10-f4a.json", "weka")
    recorded = {0: 1.0, 1: 1.0, 2: 0.4, 3: 1.0, 4: 2.0, 5: 0.9, 6: 1.2, 7: 0.8}  # sub-agent 2 slow (2.0 s)
    assert sends_s(plan, recorded)[6] == pytest.approx(4.9)  # 2.6 + 2.0 + 0.3, the README's answer


def test_otel_spans_give_the_same_graph_as_the_weka_trace_with_the_same_timings():
    [plan] = read("otel_fanout_join.json", "otel")
    by_start = sorted(range(8), key=lambda k: (plan.calls[k].t_offset_ns, k))
    weka = read("7c3e9a10-f4a.json", "weka")[0]
    assert sorted(sends_s(plan)) == sorted(sends_s(weka))
    assert [len(plan.calls[k].parents) for k in by_start] == [0, 1, 1, 1, 1, 1, 4, 1]
    assert max(c.agent for c in plan.calls) == 3 and plan.calls[6].parents == (1, 3, 4, 5)
    assert [c.context for c in plan.calls if c.agent > 0 and c.step == 0] == [None] * 3  # fresh contexts
    assert plan.calls[0].prompt_tokens == 44 and plan.calls[6].prompt_tokens == 216 - 86 - 14


def test_otlp_json_reads_as_the_flat_span_file():
    [flat], [otlp] = read("otel_tool_chain.json", "otel"), read("otlp_tool_chain.json", "otel")
    assert flat.calls == otlp.calls
    assert graph(flat) == [((), None, 0, "none", 0), ((0,), 0, 250, "tool", 0), ((1,), 1, 750, "tool", 0),
                           ((2,), 2, 8000, "think", 0)]


def test_an_async_sub_agent_is_joined_by_nothing_and_the_parent_goes_on():
    [plan] = read("e05a7f3b-1d2.json", "weka")
    assert graph(plan) == [((), None, 0, "none", 0), ((0,), None, 100, "tool", 1), ((1,), 1, 200, "tool", 1),
                           ((0,), 0, 500, "tool", 0)]
    assert not any(1 in c.parents or 2 in c.parents for c in plan.calls if c.agent == 0)
    assert sends_s(plan) == [0.0, 0.1, 0.3, 0.5]


def test_recorded_waits_are_capped_by_max_wait_s():
    chain = read("2b81d0c4-6e7.json", "weka", max_wait_s=5.0)[0]
    assert [c.wait_ns / 1e9 for c in chain.calls] == [0.0, 0.25, 0.75, 5.0]
    assert [c.wait_kind for c in chain.calls] == ["none", "tool", "tool", "think"]


def test_weka_jsonl_holds_sessions_whose_local_hash_ids_never_collide():
    one, chain, _ = read("weka_traces.jsonl", "weka")
    assert graph(one) == FANOUT and len(chain.calls) == 4
    ids_one = {b for c in one.calls for b in c.blocks or ()}
    ids_chain = {b for c in chain.calls for b in c.blocks or ()}
    assert not ids_one & ids_chain  # same numbers (1..14) in both traces, local scope: different text
    subs = [c.blocks for c in one.calls if c.agent > 0 and c.step == 0]
    assert all(b is not None and b[:2] == subs[0][:2] for b in subs)  # the sub-agents share blocks 101, 102
    assert one.calls[1].blocks == tuple(one.calls[0].blocks[0] - 1 + h for h in (11, 12, 13))  # only new blocks


def test_our_jsonl_gives_two_sessions_and_a_join_of_three():
    s1, s2 = read("loadgen_sessions.jsonl", "loadgen")
    assert graph(s1) == [((), None, 0, "none", 0), ((0,), None, 0, "none", 1), ((0,), None, 0, "none", 2),
                         ((0,), None, 0, "none", 3), ((0, 1, 2, 3), 0, 300, "tool", 0)]
    assert graph(s2) == [((), None, 0, "none", 0), ((0,), 0, 250, "tool", 0), ((1,), 1, 2000, "think", 0)]
    assert (s1.source, s2.source, s1.calls[0].tool_turn) == ("loadgen:s1", "loadgen:s2", True)


BAD_LINES = [
    ('{"session": "s", "call": "a", "prompt_tokens": 5, "output_tokens": 5}\n{"session": "s", "call"', "loadgen",
     ":2: not JSON"),
    ('{"session": "s", "call": "a", "prompt_tokens": 5, "output_tokens": 5, "colour": 1}', "loadgen",
     ":1: a call is an object"),
    ('{"session": "s", "call": "a", "after": ["z"], "prompt_tokens": 5, "output_tokens": 5}', "loadgen",
     ":1: after and context must name earlier calls of session s"),
    ('{"session": "s", "call": "a", "prompt_tokens": 0, "output_tokens": 5}', "loadgen",
     ":1: .prompt_tokens must be a whole number >= 1"),
    ('{"id": "x", "requests": [{"t": 0, "type": "n", "in": -3, "out": 1}]}', "weka",
     ":1: requests[0].in must be a whole number >= 1"),
    ('{"id": "x", "requests": [{"t": 0, "type": "q", "in": 3, "out": 1}]}', "weka",
     ":1: requests[0].type must be n, s or subagent"),
    ('{"trace_id": "t", "spans": [{"name": "invoke_agent a", "start_time": "2026-01-01T00:00:00Z", '
     '"end_time": "2026-01-01T00:00:01Z", "attributes": {}}]}', "otel", ": trace t has no chat spans"),
    ('{"trace_id": "t", "spans": [{"name": "chat m", "start_time": "yesterday", "end_time": "x"}]}', "otel",
     ": spans[0]: start_time/end_time must be ISO 8601 times"),
]


@pytest.mark.parametrize("text,fmt,message", BAD_LINES)
def test_a_bad_trace_is_one_line_naming_the_file_and_line(tmp_path, text, fmt, message):
    path = tmp_path / "trace.jsonl"
    path.write_text(text + "\n")
    with pytest.raises(ScenarioError) as err:
        read_agent_trace(SessionTrace(path=path, format=fmt))  # type: ignore[arg-type]
    assert str(err.value).startswith(str(path)) and message in str(err.value) and "\n" not in str(err.value)


def test_validate_refuses_a_scenario_whose_trace_is_bad_with_exit_2(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"session": "s", "call": "a", "prompt_tokens": 5, "output_tokens": 5}\n'
                                      '{"session": "s", "call": "b", "after": ["nope"], "prompt_tokens": 5, '
                                      '"output_tokens": 5}\n')
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: t\nload: {arrival: concurrency, concurrency: 2, duration_s: 5}\nworkload:\n"
                        "  classes:\n    - name: agent\n      session: {trace: {path: t.jsonl, format: loadgen}}\n")
    result = CliRunner().invoke(app, ["validate", str(scenario)])
    assert result.exit_code == 2 and "t.jsonl:2: after and context" in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name,fmt,says", [
    ("weka_traces.jsonl", "weka", "3 sessions, 16 calls"),
    ("otel_fanout_join.json", "otel", "widest fan-out 3; joins 1"),
    ("loadgen_sessions.jsonl", "loadgen", "2 sessions, 8 calls"),
])
def test_dataset_inspect_describes_an_agent_trace(name, fmt, says):
    result = CliRunner().invoke(app, ["dataset", "inspect", str(DATA / name), "--format", fmt],
                                env={"COLUMNS": "400"})
    # the console may wrap (its width is fixed when first built, whatever COLUMNS says here): words, not lines
    assert result.exit_code == 0 and says in " ".join(result.output.split()), result.output


AUTO = [("7c3e9a10-f4a.json", "weka"), ("2b81d0c4-6e7.json", "weka"), ("e05a7f3b-1d2.json", "weka"),
        ("weka_traces.jsonl", "weka"), ("otel_fanout_join.json", "otel"), ("otel_tool_chain.json", "otel"),
        ("otlp_tool_chain.json", "otel"), ("loadgen_sessions.jsonl", "loadgen")]


def test_every_fixture_is_told_its_format_by_its_first_document():
    assert sorted(p.name for p in DATA.iterdir() if p.name != "README.md") == sorted(n for n, _ in AUTO)
    assert [trace_format_of(DATA / name) for name, _ in AUTO] == [fmt for _, fmt in AUTO]


def test_a_dataset_or_a_file_that_is_not_json_is_no_agent_trace(tmp_path):
    files = {"d.jsonl": '{"prompt": "hi"}\n', "s.json": '[{"conversations": []}]', "c.csv": "session,call\n",
             "bad.json": "{nope", "calls.jsonl": '{"session": "s", "call": "a", "prompt": "extra key"}\n',
             "empty.jsonl": "\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        assert trace_format_of(tmp_path / name) is None, name


@pytest.mark.parametrize("name,fmt", [("weka_traces.jsonl", "weka"), ("7c3e9a10-f4a.json", "weka"),
                                      ("otel_fanout_join.json", "otel"), ("otlp_tool_chain.json", "otel"),
                                      ("loadgen_sessions.jsonl", "loadgen")])
def test_dataset_inspect_with_format_auto_describes_an_agent_trace_as_its_explicit_format_does(name, fmt):
    auto, explicit = (CliRunner().invoke(app, ["dataset", "inspect", str(DATA / name), *flag],
                                         env={"COLUMNS": "400"}) for flag in ([], ["--format", fmt]))
    assert auto.exit_code == 0 and f"{fmt} agent trace, " in " ".join(auto.output.split()), auto.output
    assert auto.output == explicit.output


def test_dataset_inspect_with_format_auto_still_reads_a_dataset(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "hello there"}\n{"prompt": "hi"}\n')
    result = CliRunner().invoke(app, ["dataset", "inspect", str(path)], env={"COLUMNS": "400"})
    assert result.exit_code == 0 and ": jsonl, 2 rows" in " ".join(result.output.split()), result.output


@pytest.mark.parametrize("name,text,why", [("notes.txt", "hello", "cannot tell the format from '.txt'"),
                                           ("odd.json", '{"colour": 1}', "not valid sharegpt")])
def test_dataset_inspect_with_format_auto_names_what_it_expected_in_one_line_and_exits_2(tmp_path, name, text, why):
    path = tmp_path / name
    path.write_text(text)
    result = CliRunner().invoke(app, ["dataset", "inspect", str(path)], env={"COLUMNS": "400"})
    line = result.output.strip()
    assert result.exit_code == 2 and "\n" not in line and why in line, result.output
    assert "agent trace (WEKA" in line and "OTLP JSON" in line and "--format" in line and "Traceback" not in line


def test_the_fixture_readme_matches_the_files():
    readme = (DATA / "README.md").read_text()
    for path in DATA.iterdir():
        if path.name != "README.md":
            assert f"`{path.name}`" in readme
            if path.suffix == ".json":
                json.loads(path.read_text())


def span(sid: str, agent: str, start: float, end: float, said: list[str], answer: str, **usage: int) -> dict:
    """An inference-perf span with semconv ``parts`` messages and the older usage names."""
    def at(t: float) -> str:
        return f"2026-01-01T00:00:{t:06.3f}Z"
    messages = [{"role": "user", "parts": [{"type": "text", "content": "go"}]}] + [
        {"role": "assistant", "parts": [{"type": "text", "content": s}]} for s in said]
    return {"span_id": sid, "name": "chat m", "start_time": at(start), "end_time": at(end), "attributes": {
        "gen_ai.operation.name": "chat", "gen_ai.agent.name": agent, "gen_ai.input.messages": json.dumps(messages),
        "gen_ai.output.text": answer, **{f"gen_ai.usage.{k}": v for k, v in usage.items()}}}


def test_otel_joins_come_from_the_answers_a_call_carries_not_from_timing_alone(tmp_path):
    spans = [span("a", "lead", 0, 1, [], "plan it", prompt_tokens=10, completion_tokens=3),
             span("b", "w1", 1.2, 2, [], "w1 says x", prompt_tokens=5, completion_tokens=4),
             span("c", "w2", 1.2, 3, [], "w2 says y", prompt_tokens=6, completion_tokens=4),
             span("d", "lead", 3.5, 4, ["plan it", "w1 says x", "w2 says y"], "done", prompt_tokens=40,
                  completion_tokens=2),
             span("e", "other", 5, 6, [], "unrelated")]  # no content link: only the temporal edge
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"trace_id": "t1", "spans": spans}))
    [plan] = read_agent_trace(SessionTrace(path=path, format="otel"))
    assert graph(plan) == [((), None, 0, "none", 0), ((0,), None, 200, "tool", 1), ((0,), None, 200, "tool", 2),
                           ((0, 1, 2), 0, 500, "tool", 0), ((3,), None, 1000, "tool", 3)]
    assert [c.prompt_tokens for c in plan.calls][:4] == [10, 5, 6, 40 - 13] and plan.calls[0].tool_turn
