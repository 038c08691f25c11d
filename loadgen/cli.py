"""The ``loadgen`` command line (typer). Exit codes: 0 pass, 1 SLO failed, 2 usage/config error (nothing sent),
3 inconclusive."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .analysis.slo import EXIT_CODES
from .scenario import ScenarioError, load_scenario

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Load generator and SLO tester for OpenAI-compatible LLM endpoints.")
console = Console()
err = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(2)


def _overrides(sets: list[str], base_url: str | None, model: str | None, api_key_env: str | None,
               duration: float | None) -> list[str]:
    items = list(sets)
    for key, value in (("target.base_url", base_url), ("target.model", model),
                       ("target.api_key_env", api_key_env), ("load.duration_s", duration)):
        if value is not None:
            items.append(f"{key}={json.dumps(value)}")
    return items


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="scenario file (YAML)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible base URL (…/v1); "
                                           "default: the scenario's, 'embedded' starts the bundled simulator"),
    model: Optional[str] = typer.Option(None, "--model", help="model name ('auto' = first of /v1/models)"),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="environment variable with the API key"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the run here (default reports/<time>-<name>)"),
    duration: Optional[float] = typer.Option(None, "--duration", help="measured seconds (load.duration_s)"),
    set_: list[str] = typer.Option([], "--set", help="override any field: --set load.rate_per_s=8 (repeatable)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no live progress bar"),
) -> None:
    """Run a scenario, write the run directory and print the verdict."""
    from .runner import RunOptions, TargetError, run_scenario

    try:
        sc = load_scenario(scenario, _overrides(set_, base_url, model, api_key_env, duration))
        code, _ = run_scenario(sc, RunOptions(out=out, progress=not no_progress), console)
    except (ScenarioError, TargetError) as exc:
        raise _fail(str(exc)) from None
    raise typer.Exit(code)


@app.command()
def validate(
    scenario: Path = typer.Argument(..., help="scenario file (YAML)"),
    set_: list[str] = typer.Option([], "--set", help="override any field, as in run"),
) -> None:
    """Check a scenario file; print its plan's size. Exit 2 naming the field, value and line if it is bad."""
    from .schedule import build_plan

    try:
        sc = load_scenario(scenario, set_)
        plan = build_plan(sc)
    except ScenarioError as exc:
        raise _fail(str(exc)) from None
    size = plan.size if plan.size is not None else f"closed loop × {sc.load.concurrency}"
    console.print(f"{scenario}: ok — {sc.name}, {size} requests planned, "
                  f"{len(sc.workload.classes)} class(es), target {sc.target.base_url}", highlight=False)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a run directory (reports/<run_id>)")) -> None:
    """Recompute the summary, verdict and reports from the run's Parquet records."""
    from .report.console import print_summary
    from .runner import rebuild_reports

    if not (run_dir / "run.json").exists():
        raise _fail(f"{run_dir}: no run.json (is this a loadgen run directory?)")
    try:
        summary = rebuild_reports(run_dir)
    except (FileNotFoundError, ScenarioError) as exc:
        raise _fail(str(exc)) from None
    print_summary(console, summary, str(run_dir))
    raise typer.Exit(EXIT_CODES[summary["verdict"]])


def main() -> None:
    app()


if __name__ == "__main__":
    main()
