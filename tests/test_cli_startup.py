"""What a user meets first (issue 50): ``loadgen --version`` and every command's help start without importing
the machinery of any command (the analysis, the report, the drivers, the scenario models): what each start
imports is checked, not timed (bench/startup.py times it). And the help names every value (``--set FIELD=VALUE``,
never typer's ``<list[str]>`` or ``<int range>``), shows time defaults with their unit, and says what it does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any, Iterator

import pytest
import typer.main
from typer.testing import CliRunner

from loadgen import __version__
from loadgen.cli.app import app

HEAVY = {"polars", "numpy", "scipy", "altair", "locust", "gevent", "pyarrow", "httpx", "pydantic", "yaml",
         "loadgen.api", "loadgen.plan.scenario", "loadgen.analysis", "loadgen.report", "loadgen.drivers"}

# the entry point as the console script runs it; then every module the process holds, on stderr
PROBE = """
import json, sys
from loadgen.cli.main import main
sys.argv = ["loadgen", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
print("MODULES", code, " ".join(sorted(sys.modules)), file=sys.__stderr__)
"""


def started(*args: str) -> tuple[int, str, set[str]]:
    """``loadgen ARGS`` in a fresh interpreter: its exit code, its output, the modules it imported."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          env={"COLUMNS": "80", "PATH": ""}, timeout=120)
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    _, code, *modules = line.split()
    return int(code), done.stdout, set(modules)


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m in HEAVY or m.split(".")[0] in HEAVY or ".".join(m.split(".")[:2]) in HEAVY}


def test_version_is_answered_before_the_application_is_built() -> None:
    code, out, modules = started("--version")
    assert (code, out) == (0, f"loadgen {__version__}\n")
    assert not heavy(modules) and "typer" not in modules, sorted(heavy(modules) | {"typer"} & modules)
    from loadgen.cli import main

    assert main.app is app  # the entry point's module still offers the application, built when asked for


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["target", "vllm", "-h"],
                                  ["dataset", "inspect", "-h"]])
def test_help_starts_without_any_commands_machinery(args: list[str]) -> None:
    code, out, modules = started(*args)
    assert code == 0 and "Usage:" in out
    assert not heavy(modules), sorted(heavy(modules))


ROOT = typer.main.get_command(app)


def commands(command: Any = ROOT, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    yield " ".join(path), command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from commands(sub, (*path, name))


ALL = list(commands())


def help_of(path: str) -> str:
    res = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert res.exit_code == 0, res.output
    return res.output


def test_building_the_application_and_every_help_imports_no_commands_machinery() -> None:
    code = ("import sys; from typer.testing import CliRunner; from loadgen.cli.app import app; "
            f"paths = {[p for p, _ in ALL]!r}; "
            "codes = [CliRunner().invoke(app, [*p.split(), '--help']).exit_code for p in paths]; "
            "print(codes, ' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    codes, modules = out.split("] ")
    assert set(json.loads(codes + "]")) == {0}
    assert not heavy(set(modules.split())), sorted(heavy(set(modules.split())))


@pytest.mark.parametrize("path, command", ALL, ids=[p or "loadgen" for p, _ in ALL])
def test_every_value_in_help_has_a_name(path: str, command: Any) -> None:
    text = help_of(path)
    assert "list[" not in text and "range>" not in text, text
    for param in command.params:
        if param.param_type_name == "option" and not param.is_flag:
            assert param.metavar and not re.search(r"list\[|range|^<", param.metavar), (path, param.opts)


def _time_options() -> Iterator[tuple[str, Any]]:
    for path, command in ALL:
        for param in command.params:
            parser = getattr(getattr(param, "type_descriptor", None), "parameter_info", None)
            if getattr(getattr(parser, "parser", None), "kind", None) == "seconds":
                yield path, param


def test_every_time_default_in_help_carries_its_unit() -> None:
    found = list(_time_options())
    assert any(p.opts[0] == "--server-metrics-period" for _, p in found)
    for path, param in found:
        line = " ".join(help_of(path).split())  # the help record, unwrapped
        shown = re.search(re.escape(param.opts[0]) + r" TIME .*?\[default: ([^\];]+)", line)
        if param.default is not None:
            assert shown and re.fullmatch(r"[0-9.]+(ms|s|m|h)", shown.group(1)), (path, param.opts[0], shown)


def test_repeat_help_agrees_with_the_range_it_accepts() -> None:
    from loadgen.run.repeat import MAX_REPEAT

    repeat = next(p for p in dict(ALL)["run"].params if p.name == "repeat")
    assert (repeat.min, repeat.max) == (1, MAX_REPEAT)
    line = " ".join(help_of("run").split())
    record = line[line.index("--repeat N"):]
    assert f"[default: 1; 1<=x<={MAX_REPEAT}]" in record
    assert not re.search(r"\b(?!1\b)\d+\s*-\s*\d+\b", record.split("[default")[0]), record  # no other range
    res = CliRunner().invoke(app, ["run", "--base-url", "embedded", "--repeat", str(MAX_REPEAT + 1)])
    assert res.exit_code == 2 and "--repeat" in res.output


def test_the_dataset_group_names_the_commands_it_has() -> None:
    group = dict(ALL)["dataset"]
    said = set(re.findall(r"[a-z][a-z-]+", group.help))
    assert set(group.commands) <= said
    other = {p.split()[-1] for p, _ in ALL if p and not p.startswith("dataset")} - set(group.commands) - {"run"}
    assert not said & other, said & other  # e.g. "a check": there is no `loadgen dataset check`
