"""``loadgen scenario list|show|copy``: the scenarios shipped in the package (plan/bundled.py), so a newcomer
with only the wheel can see them, read one, and copy one (with its schema and data files) to edit and run."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from loadgen.cli.aliases import Group
from loadgen.cli.common import console, fail
from loadgen.plan import bundled

app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None, help="The bundled scenarios: list them, "
                  "show one, copy one to edit; and the nightly CI workflow that runs one (workflow).")
WORKFLOW = Path("ci") / "nightly-slo.yml"  # in the bundled folder; the same bytes as .github/workflows/ (tested)


@app.command("list")
def list_() -> None:
    """Every bundled scenario: its name, what it does, and how long it runs."""
    table = Table(box=None, pad_edge=False)
    table.add_column("name", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("what it does")
    for name in bundled.names():
        description, wall_s = bundled.summary(name)
        table.add_row(name, "–" if wall_s is None else f"~{wall_s:g} s", description)
    console.print(table, highlight=False)
    console.print("loadgen scenario show NAME · loadgen run NAME · loadgen scenario copy NAME",
                  highlight=False, markup=False)


@app.command()
def show(name: str = typer.Argument(..., help="a bundled scenario's name (loadgen scenario list)")) -> None:
    """Print a bundled scenario's YAML."""
    try:
        text = bundled.text(name)
    except ValueError as exc:
        raise fail(str(exc)) from None
    typer.echo(text, nl=not text.endswith("\n"))


@app.command()
def copy(name: str = typer.Argument(..., help="a bundled scenario's name (loadgen scenario list)"),
         dest: Optional[Path] = typer.Argument(None, help="the folder to copy into (default: here)")) -> None:
    """Copy a bundled scenario, its schema and the data files it refers to into DEST (never overwrites a
    file that differs)."""
    try:
        source = bundled.path(name)
        parts = [source.name, bundled.SCHEMA, *bundled.data_files(source.stem)]
    except ValueError as exc:
        raise fail(str(exc)) from None
    folder = dest or Path(".")
    if folder.exists() and not folder.is_dir():
        raise fail(f"{folder}: not a folder")
    there = [p for p in parts if (folder / p).exists()]
    differ = [p for p in there if not (folder / p).is_file() or
              (folder / p).read_bytes() != (bundled.folder() / p).read_bytes()]
    if differ:
        raise fail(f"{folder / differ[0]} exists: nothing copied (remove it, or copy into another folder: "
                   f"loadgen scenario copy {source.stem} DEST)")
    parts = [p for p in parts if p not in there]  # the same bytes there already (the schema of another copy)
    for part in parts:
        (folder / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundled.folder() / part, folder / part)
    if parts:
        console.print(f"wrote {', '.join(str(folder / p) for p in parts)}", highlight=False, markup=False)
    console.print(f"run it: loadgen run {folder / source.name}", highlight=False, markup=False)


@app.command()
def workflow(dest: Optional[Path] = typer.Argument(None, help="the folder to write it into (default: "
                                                   ".github/workflows, run from the repository's root)")) -> None:
    """Write the nightly SLO workflow (GitHub Actions: run the nightly scenario, compare with the last good
    night, publish the summary, fail the job on exit 1-4) into DEST/nightly-slo.yml (never overwrites a file
    that differs). The CI gating guide (docs/guides/ci-gating.md) explains it."""
    source = bundled.folder() / WORKFLOW
    folder = dest or Path(".github") / "workflows"
    target = folder / source.name
    if folder.exists() and not folder.is_dir():
        raise fail(f"{folder}: not a folder")
    if target.exists() and (not target.is_file() or target.read_bytes() != source.read_bytes()):
        raise fail(f"{target} exists and differs: nothing written (remove it, or write into another folder: "
                   "loadgen scenario workflow DEST)")
    there = target.exists()  # the same bytes: nothing to do
    if not there:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    console.print(f"{target}: {'already there' if there else 'written'}", highlight=False, markup=False)
    console.print("its scenario: scenarios/nightly.yaml (loadgen scenario copy nightly scenarios, to edit it; "
                  "without it the bundled nightly runs)\ninstall: set the repository variable LOADGEN_PIP to "
                  "loadgen's pip requirement (a wheel's URL, git+https://…)\ntarget: the secrets LOADGEN_BASE_URL, "
                  "LOADGEN_MODEL, LOADGEN_API_KEY (unset: the embedded simulator)",
                  highlight=False, markup=False, soft_wrap=True)
