"""Scenario files: validation errors name field, value and line; overrides; env expansion; the plan."""

from __future__ import annotations

import typing
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loadgen.cli.app import app
from loadgen.plan.scenario import ScenarioError
from loadgen.plan.scenario_file import load_scenario
from loadgen.plan.schedule import build_plan

SCENARIOS = sorted(Path(__file__).resolve().parents[1].joinpath("scenarios").glob("*.yaml"))

BASE = """\
name: t
seed: 5
load:
  arrival: poisson
  rate_per_s: 10
  duration_s: 20
workload:
  classes:
    - name: a
      prompt_tokens: {dist: fixed, value: 100}
      output_tokens: {dist: uniform, min: 10, max: 20}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_bundled_scenario_validates(path):
    plan = build_plan(load_scenario(path))
    assert plan.size or (plan.closed_loop and plan.hard_end_s(0))  # a closed loop bounded by its duration alone


@pytest.mark.parametrize("old, new, expected", [
    ("rate_per_s: 10", "rate_per_s: -1", r"s.yaml:5: load.rate_per_s: Input should be greater than 0 \(got -1\)"),
    ("rate_per_s: 10", "rate_per_s: fast", r"s.yaml:5: load.rate_per_s: .*number.*\(got 'fast'\)"),
    ("duration_s: 20", "duration_s: 20\n  bogus: 1", r"s.yaml:7: load.bogus: Extra inputs are not permitted"),
    ("{dist: fixed, value: 100}", "{dist: zipf, value: 100}", r"s.yaml:10: workload.classes.0.prompt_tokens"),
    ("{dist: uniform, min: 10, max: 20}", "{dist: uniform, min: 30, max: 20}",
     r"s.yaml:11: workload.classes.0.output_tokens.*max \(20\) is below min \(30\)"),
    ("arrival: poisson", "arrival: concurrency", r"s.yaml:4: load: .*needs load.concurrency"),
    ("name: t", "name: t\ntarget: {base_url: 'ftp://x'}", r"s.yaml:2: target.base_url: .*http"),
    ("name: t", "name: t\ntarget: {simulator: {kv_cache_tokenz: 1}}", r"s.yaml:2: target.simulator.kv_cache_tokenz: Extra inputs"),
])
def test_errors_name_field_value_and_line(tmp_path, old, new, expected):
    with pytest.raises(ScenarioError, match=expected):
        load_scenario(_write(tmp_path, BASE.replace(old, new)))


def test_yaml_syntax_error_names_the_line(tmp_path):
    with pytest.raises(ScenarioError, match=r"s.yaml:7: not valid YAML: .*flow sequence at line 6"):
        load_scenario(_write(tmp_path, BASE.replace("duration_s: 20", "duration_s: [20")))


def test_set_overrides_any_field_including_list_items(tmp_path):
    s = load_scenario(_write(tmp_path, BASE), ["load.rate_per_s=8", "workload.classes.0.weight=2.5",
                                               "target.simulator.chunked_prefill=false"])
    assert s.load.rate_per_s == 8 and s.workload.classes[0].weight == 2.5
    assert s.target.simulator.overrides() == {"chunked_prefill": False}
    with pytest.raises(ScenarioError, match="has no item 3"):
        load_scenario(_write(tmp_path, BASE), ["workload.classes.3.weight=1"])
    with pytest.raises(ScenarioError, match="expected FIELD=VALUE"):
        load_scenario(_write(tmp_path, BASE), ["load.rate_per_s"])


def test_env_expansion(tmp_path, monkeypatch):
    text = BASE.replace("name: t", "name: t\ntarget: {base_url: '${MY_URL:-embedded}', model: '${MY_MODEL}'}")
    monkeypatch.setenv("MY_MODEL", "m1")
    assert load_scenario(_write(tmp_path, text)).target.base_url == "embedded"
    monkeypatch.setenv("MY_URL", "http://127.0.0.1:9/v1")
    s = load_scenario(_write(tmp_path, text))
    assert (s.target.base_url, s.target.model) == ("http://127.0.0.1:9/v1", "m1")
    monkeypatch.setenv("MY_URL", "")  # an unset CI secret arrives as an empty string: ":-" applies, as in sh
    assert load_scenario(_write(tmp_path, text)).target.base_url == "embedded"
    monkeypatch.delenv("MY_MODEL")
    with pytest.raises(ScenarioError, match="MY_MODEL is not set"):
        load_scenario(_write(tmp_path, text))


def test_validate_command_exit_codes(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(_write(tmp_path, BASE))])
    assert ok.exit_code == 0 and "ok" in ok.output
    bad = runner.invoke(app, ["validate", str(_write(tmp_path, BASE.replace("rate_per_s: 10", "rate_per_s: 0")))])
    assert bad.exit_code == 2 and "load.rate_per_s" in bad.output and "Traceback" not in bad.output
    missing = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


# ---- the plan ------------------------------------------------------------------------------------------
def test_same_seed_same_plan_other_seed_other_plan(tmp_path):
    path = _write(tmp_path, BASE)
    a, b = build_plan(load_scenario(path)), build_plan(load_scenario(path))
    c = build_plan(load_scenario(path, ["seed=6"]))
    assert a.requests == b.requests and a.requests != c.requests


@pytest.mark.parametrize("arrival, extra, expected_cv", [
    ("poisson", [], 1.0), ("constant", [], 0.0),
    ("gamma", ["load.burstiness=0.3"], 0.3 ** -0.5), ("gamma", ["load.burstiness=4"], 4 ** -0.5)])
def test_arrival_rates(tmp_path, arrival, extra, expected_cv):
    plan = build_plan(load_scenario(_write(tmp_path, BASE), [f"load.arrival={arrival}", "load.duration_s=200",
                                                              *extra]))
    assert len(plan.requests) == pytest.approx(2000, rel=0.08)
    gaps = [b.t_intended_offset_ns - a.t_intended_offset_ns for a, b in zip(plan.requests, plan.requests[1:])]
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert cv == pytest.approx(expected_cv, abs=0.1)


def test_requests_bound_warmup_and_class_weights(tmp_path):
    text = BASE.replace("    - name: a", "    - name: b\n      weight: 3\n      prompt_tokens: {dist: fixed, value: 5}\n"
                        "      output_tokens: {dist: fixed, value: 5}\n    - name: a")
    plan = build_plan(load_scenario(_write(tmp_path, text), ["load.requests=4000", "load.duration_s=null",
                                                             "load.warmup_s=2"]))
    assert len(plan.requests) == 4000
    share_b = sum(r.class_name == "b" for r in plan.requests) / 4000
    assert share_b == pytest.approx(0.75, abs=0.03)
    assert all(r.warmup == (r.t_intended_offset_ns < 2e9) for r in plan.requests)


@pytest.mark.parametrize("dist, check", [
    ("{dist: normal, mean: 100, std: 10, min: 90, max: 105}", lambda v: 90 <= min(v) and max(v) <= 105),
    ("{dist: lognormal, median: 300, sigma: 0.5}", lambda v: 280 < statistics.median(v) < 320),
    ("{dist: exponential, mean: 50}", lambda v: 45 < statistics.mean(v) < 55),
    ("{dist: empirical, histogram: [[10, 10, 1], [20, 20, 3]]}", lambda v: 0.7 < v.count(20) / len(v) < 0.8),
    ("{dist: mixture, components: [{weight: 1, dist: {dist: fixed, value: 7}}, "
     "{weight: 1, dist: {dist: fixed, value: 9000}}]}", lambda v: set(v) == {7, 9000}),
])
def test_length_distributions(tmp_path, dist, check):
    plan = build_plan(load_scenario(_write(tmp_path, BASE.replace("{dist: fixed, value: 100}", dist)),
                                    ["load.requests=3000", "load.duration_s=null"]))
    assert check([r.prompt_tokens for r in plan.requests])


def test_empirical_file_and_stages_and_trace_replay(tmp_path):
    (tmp_path / "lengths.txt").write_text("length\n100\n200\n")
    (tmp_path / "trace.csv").write_text("timestamp_s,prompt_tokens,output_tokens\n10.0,50,5\n10.5,60,6\n12,70,7\n")
    text = BASE.replace("{dist: fixed, value: 100}", "{dist: empirical, file: lengths.txt}")
    plan = build_plan(load_scenario(_write(tmp_path, text), ["load.requests=500", "load.duration_s=null"]))
    assert {r.prompt_tokens for r in plan.requests} == {100, 200}
    staged = build_plan(load_scenario(_write(tmp_path, BASE), [
        "load.arrival=stages", "load.stages=[{duration_s: 50, rate_per_s: 2}, {duration_s: 50, rate_per_s: 20}]"]))
    first = sum(r.t_intended_offset_ns < 50e9 for r in staged.requests)
    assert first == pytest.approx(100, rel=0.3) and len(staged.requests) - first == pytest.approx(1000, rel=0.1)
    replay = build_plan(load_scenario(_write(tmp_path, BASE), [
        "load.arrival=trace", "load.trace={path: trace.csv, speedup: 2}"]))
    assert [(r.t_intended_offset_ns, r.prompt_tokens, r.output_tokens) for r in replay.requests] == [
        (0, 50, 5), (250_000_000, 60, 6), (1_000_000_000, 70, 7)]


def test_the_scenarios_simulator_fields_are_the_simulators_own() -> None:
    """target.simulator is typed in the plan (which must not import the simulator): same fields, same bounds,
    same preset names as local_target.sim, so a scenario the plan accepts is one the simulator starts."""
    from local_target.sim.config import (DEFAULT_PRESET, PRESETS, EffortMedians, EngineConfig, FaultConfig,
                                         ReasoningConfig)
    from loadgen.plan import simulator_spec as spec

    assert set(spec.PRESET_NAMES) == set(PRESETS) and spec.DEFAULT_PRESET == DEFAULT_PRESET
    for ours, theirs in ((spec.SimulatorSpec, EngineConfig), (spec.SimulatorFaults, FaultConfig),
                         (spec.SimulatorReasoning, ReasoningConfig), (spec.SimulatorEffortMedians, EffortMedians)):
        assert set(ours.model_fields) - set(spec.LOADGEN_ONLY) == set(theirs.model_fields)
        for name, field in theirs.model_fields.items():
            if name in ("faults", "reasoning", "median_tokens"):
                continue
            assert ours.model_fields[name].metadata == field.metadata, name  # gt/ge/le bounds
    for name in ("default_effort", "stream_field"):  # the same choices
        ours_type = spec.SimulatorReasoning.model_fields[name].annotation
        assert typing.get_args(ours_type) == typing.get_args(ReasoningConfig.model_fields[name].annotation), name
    given = spec.SimulatorSpec.model_validate({"reasoning": {"default_effort": "low", "median_tokens": {"low": 9},
                                                             "stream_field": "think_tags"},
                                               "tool_call_probability": 1.0})
    engine = EngineConfig.model_validate(given.overrides())  # what the scenario sets, the simulator takes
    assert (engine.reasoning.default_effort, engine.reasoning.median_tokens.low, engine.reasoning.median_tokens.high,
            engine.reasoning.stream_field, engine.tool_call_probability) == ("low", 9, 2048, "think_tags", 1.0)
    preset_type = spec.SimulatorSpec.model_fields["preset"].annotation
    assert set(typing.get_args(typing.get_args(preset_type)[0])) == set(PRESETS)
