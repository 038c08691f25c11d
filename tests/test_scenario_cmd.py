"""``loadgen scenario list|show|copy`` (cli/scenario.py) over the scenarios shipped in the package: every
bundled file is listed, shown as written, and a copy (with its schema and data files) validates from anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loadgen.cli.app import app
from loadgen.plan import bundled
from tests.run_helpers import ROOT

SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def cli(*args: str) -> object:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_the_bundled_folder_is_the_clones() -> None:
    assert [p.stem for p in SCENARIOS] == bundled.names()
    assert bundled.folder().resolve() == (ROOT / "scenarios").resolve()  # the wheel's copy: tests/test_newcomer.py


def test_list_shows_every_scenario_with_its_description() -> None:
    res = cli("scenario", "list")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for path in SCENARIOS:
        description, _ = bundled.summary(path.stem)
        row = next(line for line in lines if line.split()[:1] == [path.stem])
        assert description[:40] in row
    smoke = next(line for line in lines if line.startswith("smoke "))
    assert "~14 s" in smoke  # warmup_s 2 + duration_s 12


@pytest.mark.parametrize("name", ["long_context", "smoke.yaml"])
def test_show_prints_the_file_as_written(name: str) -> None:
    res = cli("scenario", "show", name)
    assert res.exit_code == 0 and res.output == (ROOT / "scenarios" / f"{Path(name).stem}.yaml").read_text()


def test_an_unknown_name_lists_the_bundled_ones() -> None:
    for args in (("show", "long_contxt"), ("copy", "long_contxt")):
        res = cli("scenario", *args)
        assert res.exit_code == 2 and "long_context" in res.output and "no bundled scenario" in res.output


def test_copy_brings_schema_and_data_and_validates_from_anywhere(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = cli("scenario", "copy", "sharegpt")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "sharegpt.yaml").read_text() == (ROOT / "scenarios/sharegpt.yaml").read_text()
    assert (tmp_path / "scenario.schema.json").read_bytes() == (ROOT / "scenarios/scenario.schema.json").read_bytes()
    assert (tmp_path / "data/sharegpt_sample.json").read_bytes() == \
        (ROOT / "scenarios/data/sharegpt_sample.json").read_bytes()
    assert not (tmp_path / "data/mooncake_sample.jsonl").exists()  # only what it refers to
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)  # the data path is relative to the copy, not to the cwd
    res = cli("validate", str(tmp_path / "sharegpt.yaml"))
    assert res.exit_code == 0 and "ok" in res.output, res.output


def test_copy_into_a_folder_and_never_overwrite(tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    assert cli("scenario", "copy", "long_context", str(dest)).exit_code == 0
    assert sorted(p.name for p in dest.iterdir()) == ["long_context.yaml", "scenario.schema.json"]
    (dest / "long_context.yaml").write_text("# edited\n")
    res = cli("scenario", "copy", "long_context", str(dest))
    assert res.exit_code == 2 and "exists: nothing copied" in res.output
    assert (dest / "long_context.yaml").read_text() == "# edited\n"
    assert cli("scenario", "copy", "mooncake", str(dest)).exit_code == 0  # the same schema there: kept
    assert (dest / "mooncake.yaml").is_file() and (dest / "data/mooncake_sample.jsonl").is_file()
    (dest / "scenario.schema.json").write_text("{}")
    res = cli("scenario", "copy", "smoke", str(dest))  # a schema that differs: refused whole
    assert res.exit_code == 2 and "scenario.schema.json exists" in res.output and not (dest / "smoke.yaml").exists()
