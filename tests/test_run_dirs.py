"""Run directories that cannot be read as they are: damaged record files (a copy cut short, garbage bytes) and a
run.json that is missing, not JSON, not an object, without a scenario or with an invalid one. ``loadgen compare``
(either side), ``loadgen report`` and ``loadgen advise`` refuse them with exit 2 and one line naming the file and
what is wrong, and rewrite nothing: a verdict on part of the records, or on none, would be wrong without saying
so. One real run on the embedded simulator; each test damages a copy of it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable

import polars as pl
import pytest

from loadgen import api
from tests.run_helpers import ROOT, run_cli


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run (a few seconds on the embedded simulator)."""
    sc = api.load_scenario(ROOT / "scenarios/smoke.yaml", {"load.duration_s": 2, "load.warmup_s": 0})
    result = api.run(sc, out=tmp_path_factory.mktemp("runs") / "intact")
    assert result.requests["completed"] > 0
    return result.run_dir


@pytest.fixture
def copy_of(intact: Path, tmp_path: Path) -> Callable[[str], Path]:
    def _copy(name: str) -> Path:
        return Path(shutil.copytree(intact, tmp_path / name))
    return _copy


def one_line_exit_2(res) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stdout + res.stderr, res.stderr
    return lines[0]


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


DAMAGE = {  # the file, and what is done to it
    "requests.parquet truncated": ("requests.parquet", cut_in_half),
    "requests.parquet garbage": ("requests.parquet", lambda p: p.write_bytes(b"\x00not parquet" * 64)),
    "requests.parquet empty": ("requests.parquet", lambda p: p.write_bytes(b"")),
    "chunks.parquet truncated": ("chunks.parquet", cut_in_half),
    "requests.parquet foreign": ("requests.parquet", lambda p: pl.DataFrame({"x": [1]}).write_parquet(p)),
}


def damaged_copy(copy_of: Callable[[str], Path], damage: str) -> tuple[Path, str]:
    name, how = DAMAGE[damage]
    run_dir = copy_of("damaged")
    how(run_dir / name)
    return run_dir, name


def names_the_damage(line: str, run_dir: Path, name: str) -> bool:
    """The run directory, the damaged file and the reader's reason (e.g. "The file must end with PAR1 or
    PARE"), not just an exception's class name."""
    return str(run_dir) in line and re.search(rf"\({re.escape(name)}: [^()]{{12,}}\)$", line) is not None


def test_an_intact_copy_compares_as_no_regression(intact, copy_of, tmp_path):
    """The control: the copies below differ from this one only by their damage."""
    res = run_cli("compare", str(intact), str(copy_of("same")), "--out", str(tmp_path / "cmp"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no regression" in res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("side", ["base", "new"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_compare_refuses_damaged_records_on_either_side(intact, copy_of, tmp_path, damage, side):
    run_dir, name = damaged_copy(copy_of, damage)
    pair = (run_dir, intact) if side == "base" else (intact, run_dir)
    res = run_cli("compare", str(pair[0]), str(pair[1]), "--out", str(tmp_path / "cmp"))
    assert names_the_damage(one_line_exit_2(res), run_dir, name), res.stderr
    assert "no regression" not in res.stdout and not (tmp_path / "cmp" / "compare.json").exists()


@pytest.mark.parametrize("damage", ["requests.parquet truncated", "chunks.parquet truncated"])
def test_report_refuses_damaged_records_and_keeps_the_runs_own_reports(copy_of, damage):
    """The merged files are written whole at a run's end: damage came later, and a report of what is left would
    replace the run's verdict with one of nothing."""
    run_dir, name = damaged_copy(copy_of, damage)
    kept = {f: (run_dir / f).read_bytes() for f in ("summary.json", "summary.md", "report.html", "junit.xml")}
    line = one_line_exit_2(run_cli("report", str(run_dir), "--no-png"))
    assert names_the_damage(line, run_dir, name), line
    assert {f: (run_dir / f).read_bytes() for f in kept} == kept


def test_advise_refuses_damaged_records(copy_of):
    run_dir, name = damaged_copy(copy_of, "requests.parquet garbage")
    line = one_line_exit_2(run_cli("advise", str(run_dir), "--no-png"))
    assert names_the_damage(line, run_dir, name), line
    assert not (run_dir / "advice.json").exists()


@pytest.mark.slow
def test_a_damaged_part_file_is_refused_by_compare_and_skipped_and_named_by_report(intact, copy_of, tmp_path):
    """A part left by a kill mid-write (an older version): compare needs every record; report reads the rest,
    names the part and is inconclusive (README: exit 3)."""
    run_dir = copy_of("part")
    (run_dir / "requests.part-00007.parquet").write_bytes(b"PAR1 cut short")
    (run_dir / "chunks.part-00007.parquet").write_bytes(b"")
    line = one_line_exit_2(run_cli("compare", str(intact), str(run_dir), "--out", str(tmp_path / "cmp")))
    assert "requests.part-00007.parquet" in line, line
    res = run_cli("report", str(run_dir), "--no-png")
    assert res.returncode == 3, res.stdout + res.stderr
    notes = json.loads((run_dir / "summary.json").read_text())
    assert "requests.part-00007.parquet" in json.dumps(notes)
    assert (run_dir / "requests.part-00007.parquet").exists()  # left in place, never merged away


def _set_run_json(text: str | None) -> Callable[[Path], None]:
    def apply(run_dir: Path) -> None:
        if text is None:
            (run_dir / "run.json").unlink()
        else:
            (run_dir / "run.json").write_text(text)
    return apply


def _edit_run_json(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(run_dir: Path) -> None:
        info = json.loads((run_dir / "run.json").read_text())
        edit(info)
        (run_dir / "run.json").write_text(json.dumps(info))
    return apply


MALFORMED = {  # what is done to run.json, and what the line says
    "missing": (_set_run_json(None), "no run.json"),
    "not JSON": (_set_run_json('{"scenario": '), "run.json: not readable as JSON"),
    "a list": (_set_run_json("[1, 2]"), "run.json: no scenario in it"),
    "no scenario": (_edit_run_json(lambda info: info.pop("scenario")), "run.json: no scenario in it"),
    "invalid scenario": (_edit_run_json(lambda info: info["scenario"]["load"].update(rate_per_s=-1)),
                         "run.json: its scenario is not valid: load.rate_per_s"),
    "target a string": (_edit_run_json(lambda info: info.update(target="x")), "run.json: its target is not an object (\"x\")"),
    "notes a number": (_edit_run_json(lambda info: info.update(notes=3)), "run.json: its notes is not a list (3)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("malformed", list(MALFORMED))
def test_a_malformed_run_json_is_one_line_exit_2_for_every_command(intact, copy_of, tmp_path, malformed):
    apply, says = MALFORMED[malformed]
    run_dir = copy_of("bad")
    apply(run_dir)
    commands = {"compare (base)": ["compare", str(run_dir), str(intact), "--out", str(tmp_path / "c1")],
                "compare (new)": ["compare", str(intact), str(run_dir), "--out", str(tmp_path / "c2")],
                "report": ["report", str(run_dir), "--no-png"], "advise": ["advise", str(run_dir), "--no-png"]}
    kept = (run_dir / "summary.json").read_bytes()
    for what, args in commands.items():
        line = one_line_exit_2(run_cli(*args))
        assert str(run_dir) in line and says in line, (what, line)
    assert (run_dir / "summary.json").read_bytes() == kept
    assert not any((tmp_path / c / "compare.json").exists() for c in ("c1", "c2"))
