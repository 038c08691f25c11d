"""One flag vocabulary across every command (cli/vocabulary.py): every option of every command, walked from the
application itself, is a declared name of one kind; time and share flags use the one parser of their kind;
booleans are pairs; no name carries a unit; old names work, warn once and never show in help; -h and --version."""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
import typer.main
from typer.testing import CliRunner

from loadgen import __version__
from loadgen.cli.aliases import rewrite
from loadgen.cli.app import app
from loadgen.cli.vocabulary import ALIASES, FLAGS, MIRRORED, SYNONYMS, VALUE_ALIASES, FlagError, percent, seconds

ROOT = typer.main.get_command(app)
EAGER = {"--help", "--version"}  # actions, not settings: no --no- twin


def commands(command: Any = ROOT, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    yield " ".join(path), command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from commands(sub, (*path, name))


def options(command: Any) -> Iterator[Any]:
    return (p for p in command.params if p.param_type_name == "option")


def kind_of(param: Any) -> str | None:
    """The vocabulary kind an option's parser says (cli/common.py Parser), or a boolean pair."""
    parser = getattr(getattr(param.type_descriptor, "parameter_info", None), "parser", None)
    if getattr(parser, "kind", None):
        return parser.kind
    return "bool" if param.is_flag else None


ALL = list(commands())


def test_the_walk_reaches_every_command() -> None:
    paths = {path for path, _ in ALL}
    assert {"run", "sweep", "compare", "size", "shrink", "advise", "ui", "target vllm", "target llamacpp",
            "dataset inspect"} <= paths


@pytest.mark.parametrize("path, command", ALL, ids=[p or "loadgen" for p, _ in ALL])
def test_every_option_is_in_the_vocabulary_with_its_kind(path: str, command: Any) -> None:
    for param in options(command):
        for name in param.opts:
            if name == "-h":
                continue
            assert name in FLAGS or name in MIRRORED, f"{path} {name}: not in cli/vocabulary.py FLAGS or MIRRORED"
            assert not re.search(r"-(s|pp|dir)$", name), f"{path} {name}: the unit goes in the value"
            if name in MIRRORED:
                continue
            declared, parsed = FLAGS[name].kind, kind_of(param)
            if declared in ("seconds", "percent", "bool") or parsed in ("seconds", "percent", "bool"):
                assert parsed == declared, f"{path} {name}: declared {declared}, parsed as {parsed}"
            if declared == "bool" and name not in EAGER:
                assert param.secondary_opts == [f"--no-{name[2:]}"], f"{path} {name}: a boolean is a pair"


@pytest.mark.parametrize("path, command", ALL, ids=[p or "loadgen" for p, _ in ALL])
def test_dash_h_is_help_on_every_command_and_no_old_name_shows(path: str, command: Any) -> None:
    res = CliRunner().invoke(app, [*path.split(), "-h"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "Usage:" in res.output
    old = {o for renames in ALIASES.values() for o in renames}
    shown = set(re.findall(r"--[a-z][a-z0-9-]*", res.output))
    assert not shown & old, f"{path}: old names in help: {shown & old}"


@pytest.mark.parametrize("path, command", ALL, ids=[p or "loadgen" for p, _ in ALL])
def test_help_at_80_columns_shows_every_flag_whole_and_no_line_wider(path: str, command: Any) -> None:
    res = CliRunner().invoke(app, [*path.split(), "-h"], env={"COLUMNS": "80"}, terminal_width=80)
    assert res.exit_code == 0, res.output
    assert max(map(len, res.output.splitlines())) <= 80, res.output
    shown = set(re.findall(r"--[a-z][a-z0-9-]*", res.output))
    flags = {n for p in options(command) if not p.hidden for n in (*p.opts, *p.secondary_opts) if n.startswith("--")}
    assert flags <= shown, f"{path}: cut or missing at 80 columns: {sorted(flags - shown)}"


def test_version() -> None:
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"loadgen {__version__}"


def _option_names(path: str) -> set[str]:
    command = dict(ALL)[path]
    return {n for p in options(command) for n in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("path, old, new", [(p, o, n) for p, m in ALIASES.items() for o, n in m.items()])
def test_every_alias_reaches_a_flag_of_its_command_and_warns_once(path: str, old: str, new: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    names = _option_names(path)
    assert new in names and old not in names
    args = [*path.split(), old, "5", f"{old}=7", new, old, "--", old]  # a flag's value and what follows --: kept
    assert rewrite(ROOT, args) == [*path.split(), new, "5", f"{new}=7", new, old, "--", old]
    assert capsys.readouterr().err == f"warning: {old} is now {new} (the old name goes in 0.3)\n"


@pytest.mark.parametrize("flag", sorted(VALUE_ALIASES["target vllm"]))
def test_a_switch_written_as_a_value_still_works(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    no = f"--no-{flag[2:]}"
    assert rewrite(ROOT, ["target", "vllm", flag, "off", f"{flag}=on", flag]) == ["target", "vllm", no, flag, flag]
    assert capsys.readouterr().err.count("warning:") == 2
    assert {flag, no} <= _option_names("target vllm")


def test_an_old_name_on_the_command_line_runs_the_new_flag() -> None:
    """End to end through click: the old name's value reaches the new flag (a bad one is refused by its new
    name's parser), and click's own suggestion names the new flag for a misspelling."""
    res = CliRunner().invoke(app, ["sweep", "x.yaml", "--rates", "1", "--step-duration-s", "0"])
    assert res.exit_code == 2
    assert "warning: --step-duration-s is now --step-duration" in res.stderr
    assert "--step-duration 0: give a finite time above 0" in res.stderr
    res = CliRunner().invoke(app, ["sweep", "x.yaml", "--step-duraton", "5"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--step-duration" in res.output


def test_synonyms_are_other_tools_habits_of_declared_flags() -> None:
    assert all(a in FLAGS and b in FLAGS for a, b in SYNONYMS.items())


@pytest.mark.parametrize("text, value", [("20", 20.0), ("20s", 20.0), ("2m", 120.0), ("1h", 3600.0),
                                         ("1.5m", 90.0), ("500ms", 0.5), (" 3 s ", 3.0)])
def test_seconds_take_units(text: str, value: float) -> None:
    assert seconds(text, "--duration") == pytest.approx(value)


@pytest.mark.parametrize("text", ["0", "-1", "2d", "x", "inf", "nan", ""])
def test_seconds_refuse_what_is_no_time(text: str) -> None:
    with pytest.raises(FlagError, match="^--duration "):
        seconds(text, "--duration")


def test_zero_seconds_only_where_allowed() -> None:
    assert seconds("0", "--drain-timeout", zero_ok=True) == 0 and seconds("2m", "--duration") == 120


def test_percent_reads_n_percent_and_the_old_bare_numbers_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert percent("95%", "--confidence", "fraction") == pytest.approx(0.95)
    assert capsys.readouterr().err == ""
    assert percent("0.95", "--confidence", "fraction") == pytest.approx(0.95)
    assert percent("10", "--threshold", "percent") == pytest.approx(0.10)
    err = capsys.readouterr().err
    assert "write --confidence 95%" in err and "write --threshold 10%" in err
    with pytest.raises(FlagError, match="write a percentage: --spread 10%"):
        percent("10", "--spread")
    with pytest.raises(FlagError, match="--margin 'ten'"):
        percent("ten", "--margin", "percent")
