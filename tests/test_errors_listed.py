"""A scenario's errors are all listed, one line each with its file and line (or the flag that gave the value),
and an unknown field names the one meant; a single error stays one line (plan/scenario_file.py, plan/suggest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loadgen.cli.app import app
from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.plan.scenario_file import load_scenario
from loadgen.plan.suggest import fields_at, suggest

GOOD = """name: t
target: {base_url: embedded, model: auto}
load:
  arrival: poisson
  rate_per_s: 4
  duration_s: 10
workload:
  classes:
    - name: chat
      prompt_tokens: {dist: fixed, value: 10}
      output_tokens: {dist: uniform, min: 32, max: 96}
"""


def _errors(tmp_path: Path, text: str, overrides: list[str] | None = None) -> list[str]:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path, overrides)
    return str(exc.value).splitlines()


def test_every_error_is_listed_with_its_line_and_the_field_meant(tmp_path: Path) -> None:
    text = GOOD.replace("rate_per_s: 4", "rate: 4").replace("max: 96}", "max: 96, mx: 3}")
    lines = _errors(tmp_path, text)
    src = tmp_path / "s.yaml"
    assert lines == [
        f"{src}:5: load.rate: Extra inputs are not permitted (got 4); did you mean load.rate_per_s?",
        f"{src}:11: workload.classes.0.output_tokens.mx: Extra inputs are not permitted (got 3); did you mean "
        "workload.classes.0.output_tokens.max?"]


def test_a_single_error_is_one_line(tmp_path: Path) -> None:
    lines = _errors(tmp_path, GOOD.replace("duration_s: 10", "duration_s: -1"))
    assert len(lines) == 1 and lines[0].startswith(f"{tmp_path / 's.yaml'}:6: load.duration_s: ")
    assert "more]" not in lines[0]


def test_a_set_key_is_blamed_on_its_flag_with_the_field_meant(tmp_path: Path) -> None:
    lines = _errors(tmp_path, GOOD, ["load.duration=5", "workload.classes.0.output_len=3"])
    assert lines == [
        "--set load.duration=5: load.duration: Extra inputs are not permitted (got 5); did you mean "
        "load.duration_s?",
        "--set workload.classes.0.output_len=3: workload.classes.0.output_len: Extra inputs are not permitted "
        "(got 3); did you mean workload.classes.0.output_tokens?"]


def test_the_cli_lists_them_and_exits_2(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(GOOD.replace("rate_per_s", "rate").replace("duration_s", "duraton_s"))
    res = CliRunner().invoke(app, ["validate", str(tmp_path / "s.yaml")], env={"COLUMNS": "200"})
    assert res.exit_code == 2
    assert "did you mean load.rate_per_s?" in res.stderr and "did you mean load.duration_s?" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 2


@pytest.mark.parametrize("loc, name, meant", [
    ((), "lod", "load"), (("load",), "rate", "rate_per_s"), (("load",), "warmup", "warmup_s"),
    (("target",), "url", "base_url"), (("workload", "classes", 0), "input_len", "prompt_tokens"),
    (("load",), "concurrency_limit", "max_in_flight"), (("load",), "zzzz", None)])
def test_suggestions_come_from_the_fields_at_that_place(loc: tuple, name: str, meant: str | None) -> None:
    assert suggest(Scenario, loc, name) == meant
    assert meant is None or meant in fields_at(Scenario, loc)
