"""Bad input a user meets first (issue 50): a scenario, dataset or trace nested thousands deep, a binary file
given as a scenario, --out into a folder of the user's, a report of a run that is not there, and the README's
``scenarios/…`` path outside the clone. Each is one line naming what is wrong (and where), exit 2, nothing sent
and nothing overwritten; every suggestion printed runs as printed."""

from __future__ import annotations

import json
import random
import re
import shlex
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from loadgen.cli.app import app
from loadgen.plan.agent_traces import read_agent_trace
from loadgen.plan.datasets import rows_for
from loadgen.plan.scenario import DatasetSpec, ScenarioError
from loadgen.plan.scenario_file import load_scenario
from loadgen.plan.session_spec import SessionTrace
from tests.run_helpers import run_cli

MAX_NESTING = 100  # loadgen/plan/nesting.py's limit (a literal: these tests also run on code without it)
LEVELS = st.integers(MAX_NESTING + 1, 1500)  # 1,000 is past Python's recursion limit
SHAPES = st.integers(0, 2**32)  # a nesting's shape, as a seed: which levels are lists or objects, where lines break
TOO_DEEP = f"nested more than {MAX_NESTING} levels deep (lists and objects); flatten it"
HEAD = {"name": "deep", "load": {"rate_per_s": 1, "duration_s": 1}, "workload": {"classes": [
    {"name": "c", "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 5}}]}}


def one_line(res) -> str:
    """The one line of a refused input (exit 2, no traceback); in-process (CliRunner) or a subprocess."""
    code = res.exit_code if hasattr(res, "exit_code") else res.returncode
    text = res.output if hasattr(res, "exit_code") else res.stderr
    assert code == 2, text
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text, text
    return text.strip()


def nest(levels: int, rng: random.Random, json_keys: bool, breaks: float) -> tuple[str, list[int]]:
    """``levels`` lists and objects inside each other (shape by ``rng``), line breaks between some brackets;
    the text, and the number of line breaks before each opening bracket (1-based level k: index k - 1)."""
    opens, closes, before, breaks_so_far = [], [], [], 0
    for _ in range(levels):
        obj = rng.random() < 0.5
        before.append(breaks_so_far)
        opens.append(('{"k": ' if json_keys else "{k: ") if obj else "[")
        closes.append("}" if obj else "]")
        if rng.random() < breaks:
            opens[-1] += "\n  "
            breaks_so_far += 1
    return "".join(opens) + "1" + "".join(reversed(closes)), before


# ---- 1. nesting: scenarios (YAML and JSON), --set, datasets, traces -------------------------------------------
@settings(max_examples=20)  # pure-Python YAML: ~0.1 s an example
@given(LEVELS, SHAPES, st.integers(0, 4),
       st.sampled_from(["yaml", "json"]))
def test_a_scenario_nested_too_deep_names_its_file_and_line(levels, seed, padding, fmt):
    """The bracket past the limit is on the line named: the scenario's mapping and workload's are 2 levels."""
    inner, before = nest(levels, random.Random(seed), fmt == "json", 0.05)
    if fmt == "json":
        text = "{" + '"name": "deep",\n' * (padding + 1) + '"workload": {"classes": ' + inner + "}}\n"
    else:
        text = "name: deep\n" + "# a comment\n" * padding + "workload: {classes: " + inner + "}\n"
    line = 2 + padding + before[MAX_NESTING - 2]  # the workload's line, and the line breaks in the nesting
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"deep.{fmt}"
        path.write_text(text)
        with pytest.raises(ScenarioError) as caught:
            load_scenario(path)
    assert str(caught.value) == f"{path}:{line}: {TOO_DEEP}"


def test_aliases_that_nest_past_the_limit_are_refused(tmp_path):
    """Each anchor nests 90 levels, each the one before inside it: 1,800 levels that no line shows."""
    lines = ["name: deep", "a0: &a0 " + "[" * 90 + "1" + "]" * 90]
    lines += [f"a{i}: &a{i} " + "[" * 90 + f"*a{i - 1}" + "]" * 90 for i in range(1, 20)]
    path = tmp_path / "alias.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ScenarioError, match=re.escape(TOO_DEEP)) as caught:
        load_scenario(path)
    assert str(caught.value).startswith(f"{path}:")


def test_a_set_value_nested_too_deep_names_the_flag_and_one_to_the_limit_is_taken(tmp_path):
    """No false alarm: an extra_body nested to the limit (a JSON schema, say) is a valid scenario."""
    body, _ = nest(MAX_NESTING - 3, random.Random(1), True, 0)  # scenario, target, extra_body: 3 levels
    path = tmp_path / "s.json"
    path.write_text(json.dumps(HEAD)[:-1] + ', "target": {"extra_body": {"schema": ' + body + "}}}")
    assert load_scenario(path).target.extra_body["schema"]
    assert load_scenario(path, ["target.extra_body.schema=" + body]).target.extra_body["schema"]
    with pytest.raises(ScenarioError, match=r"^--set 'target\.extra_body\.x=\[\[\[.*: " + re.escape(TOO_DEEP)):
        load_scenario(path, ["target.extra_body.x=" + "[" * 2000 + "]" * 2000])


@given(LEVELS, SHAPES, st.integers(0, 5))
def test_a_jsonl_dataset_row_nested_too_deep_names_its_line(levels, seed, good_rows):
    inner, _ = nest(levels, random.Random(seed), True, 0)
    rows = [json.dumps({"prompt": f"row {n}"}) for n in range(good_rows)] + ['{"prompt": "x", "extra": ' + inner + "}"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"deep-{levels}-{good_rows}.jsonl"
        path.write_text("\n".join(rows) + "\n")
        with pytest.raises(ScenarioError) as caught:
            rows_for(DatasetSpec(path=path), False)
    assert str(caught.value) == f"dataset {path}:{good_rows + 1}: {TOO_DEEP}"


@given(LEVELS, SHAPES)
def test_a_sharegpt_file_nested_too_deep_names_the_line(levels, seed):
    inner, before = nest(levels - 2, random.Random(seed), True, 0.05)  # 2 levels: the file's list, the record
    good = json.dumps({"conversations": [{"from": "human", "value": "hi"}]})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"deep-{levels}.json"
        path.write_text("[\n" + good + ',\n{"conversations": ' + inner + "}]\n")
        with pytest.raises(ScenarioError) as caught:
            rows_for(DatasetSpec(path=path), False)
    assert str(caught.value) == f"dataset {path}:{3 + before[MAX_NESTING - 2]}: {TOO_DEEP}"


@pytest.mark.parametrize("fmt, name, good", [
    ("weka", "t.jsonl", {"id": "a", "requests": [{"type": "n", "t": 0, "in": 8, "out": 4}]}),
    ("weka", "t.json", {"id": "a", "requests": [{"type": "n", "t": 0, "in": 8, "out": 4}]}),
    ("loadgen", "t.jsonl", {"session": "s", "call": "c", "prompt_tokens": 8, "output_tokens": 4}),
])
def test_an_agent_trace_nested_too_deep_names_its_line(tmp_path, fmt, name, good):
    deep = '{"id": "b", "requests": ' + "[" * 1100 + "]" * 1100 + "}"
    path = tmp_path / name
    path.write_text(json.dumps(good) + "\n" + deep + "\n" if name.endswith("l") else
                    "[" + json.dumps(good) + ",\n" + deep + "]\n")
    with pytest.raises(ScenarioError) as caught:
        read_agent_trace(SessionTrace(path=path, format=fmt))
    assert str(caught.value) == f"{path}:2: {TOO_DEEP}"


def test_a_load_trace_nested_too_deep_is_one_line_in_validate(tmp_path):
    rows = ['{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}',
            '{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": ' + "[" * 1100 + "]" * 1100 + "}"]
    (tmp_path / "trace.jsonl").write_text("\n".join(rows) + "\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: t\nload: {arrival: trace, trace: {path: trace.jsonl, format: mooncake}}\n"
                        "workload: {classes: [{name: c, prompt_tokens: {dist: fixed, value: 10}, "
                        "output_tokens: {dist: fixed, value: 5}}]}\n")
    res = CliRunner().invoke(app, ["validate", str(scenario)], env={"COLUMNS": "400"})
    assert one_line(res) == f"error: {tmp_path / 'trace.jsonl'}:2: {TOO_DEEP}"


def test_the_commands_of_the_issue_are_exit_2_not_a_crash(tmp_path):
    """validate (the real entry point: a crash there was exit 4), dataset inspect and run --dataset."""
    scenario = tmp_path / "deep.yaml"
    scenario.write_text("name: deep\nload: {rate_per_s: 1, duration_s: 1}\n"
                        "workload:\n  classes: " + "[" * 500 + "]" * 500 + "\n")
    assert one_line(run_cli("validate", str(scenario), timeout=60)).endswith(f"deep.yaml:4: {TOO_DEEP}")
    dataset = tmp_path / "deep.jsonl"
    dataset.write_text('{"prompt": "hi"}\n{"prompt": "hi", "x": ' + "[" * 1100 + "]" * 1100 + "}\n")
    inspect = CliRunner().invoke(app, ["dataset", "inspect", str(dataset), "--format", "jsonl"],
                                 env={"COLUMNS": "400"})
    assert f"deep.jsonl:2: {TOO_DEEP}" in one_line(inspect)
    run = run_cli("run", "--base-url", "embedded", "--dataset", str(dataset), "--rate", "50", "--duration", "1",
                  "--slo", "error_rate.max=1%", "--out", str(tmp_path / "r"), "--no-progress", timeout=120)
    assert f"deep.jsonl:2: {TOO_DEEP}" in one_line(run) and not (tmp_path / "r").exists()


# ---- 2. a file that is not text -----------------------------------------------------------------------------
@pytest.mark.parametrize("data, message", [
    (b"\0\0\0name: x\n", "nul.yaml:1: not a text file (NUL byte at offset 0)"),
    (b"name: x\nload: {}\n\0", "nul.yaml:3: not a text file (NUL byte at offset 17)"),
    ("name: x\n".encode("utf-16"), "nul.yaml:1: not a text file (NUL byte at offset 3)"),
    (b"name: x\ndescription: a\x01b\n", "nul.yaml:2: not valid YAML: character U+0001 is not allowed in YAML"),
])
def test_a_binary_scenario_file_is_one_line_naming_what_is_wrong(tmp_path, data, message):
    path = tmp_path / "nul.yaml"
    path.write_bytes(data)
    assert message in one_line(CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "400"}))


def test_a_file_of_nul_bytes_is_exit_2_from_the_command_line_not_a_crash(tmp_path):
    path = tmp_path / "zeros.yaml"
    path.write_bytes(bytes(1024))
    assert one_line(run_cli("validate", str(path), timeout=60)).endswith(
        "zeros.yaml:1: not a text file (NUL byte at offset 0); a scenario is YAML text in UTF-8")


# ---- 3. --out into a folder of the user's ----------------------------------------------------------------
@pytest.mark.parametrize("command", [
    ["run", "--base-url", "embedded", "--duration", "1"],
    ["run", "--base-url", "embedded", "--duration", "1", "--repeat", "2"],
    ["sweep", "smoke", "--rate", "1,2"],
    ["shrink", "no-such-run"],
])
def test_out_into_a_folder_of_the_users_is_refused_and_nothing_is_overwritten(tmp_path, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": true}\n')
    res = CliRunner().invoke(app, [*command, "--out", str(out)], env={"COLUMNS": "400"})
    line = one_line(res)
    assert f"--out {out} holds files that are not a loadgen run (summary.json)" in line
    assert f"--out {out / 'run-1'}" in line  # the suggestion: a new directory inside it
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    assert (out / "summary.json").read_text() == '{"mine": true}\n'


def test_out_into_an_earlier_sweep_is_refused_as_a_run(tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text("{}")
    res = CliRunner().invoke(app, ["run", "--base-url", "embedded", "--duration", "1", "--out", str(out)],
                             env={"COLUMNS": "400"})
    assert f"--out {out} holds an earlier loadgen run (sweep.json)" in one_line(res)


# ---- 4. report of a directory that is not there -------------------------------------------------------------
def test_report_of_a_missing_directory_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["report", "reports/nope"], env={"COLUMNS": "400"})
    assert one_line(res) == "error: reports/nope: no such directory"
    (tmp_path / "reports" / "20260101-000000-smoke").mkdir(parents=True)
    (tmp_path / "reports" / "20260101-000000-smoke" / "run.json").write_text("{}")
    res = CliRunner().invoke(app, ["report", "reports/nope"], env={"COLUMNS": "400"})
    assert one_line(res) == ("error: reports/nope: no such directory; the latest run beside it: loadgen report "
                             "reports/20260101-000000-smoke")


# ---- 5. the README's path outside the clone ------------------------------------------------------------------
def test_a_bundled_scenarios_path_outside_the_clone_names_the_bundled_one_and_its_commands_run(tmp_path,
                                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)  # no scenarios/ here, as for an installed wheel
    runner = CliRunner()
    line = one_line(runner.invoke(app, ["validate", "scenarios/long_context.yaml"], env={"COLUMNS": "400"}))
    assert line.startswith("error: scenarios/long_context.yaml: cannot read: No such file or directory; ")
    commands = re.findall(r"(loadgen (?:run|scenario copy) [^,;)]+)", line)
    assert commands == ["loadgen run long_context", "loadgen scenario copy long_context scenarios"], line
    by_name = runner.invoke(app, ["validate", *shlex.split(commands[0])[2:]])
    assert by_name.exit_code == 0, by_name.output
    copied = runner.invoke(app, shlex.split(commands[1])[1:])
    assert copied.exit_code == 0, copied.output
    again = runner.invoke(app, ["validate", "scenarios/long_context.yaml"])  # the README's command, as typed
    assert again.exit_code == 0, again.output
