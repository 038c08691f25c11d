"""``loadgen run``: a scenario file, or a quick start from flags alone, against a target; writes the run
directory and prints the verdict. Exit codes (run/exits.py): 0 pass, 1 SLO failed, 2 usage/config error (nothing
sent), 3 inconclusive or interrupted, 4 internal error."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Optional

import typer

from loadgen import api
from loadgen.cli.common import check_out_dir, console, fail, load, scenario_overrides
from loadgen.plan.scenario import ScenarioError


def run(
    scenario: Path = typer.Argument(..., help="scenario file (YAML)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible base URL (…/v1); "
                                           "default: the scenario's, 'embedded' starts the bundled simulator"),
    model: Optional[str] = typer.Option(None, "--model", help="model name ('auto' = first of /v1/models)"),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="environment variable with the API key"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the run here (default reports/<time>-<name>)"),
    duration: Optional[float] = typer.Option(None, "--duration", help="measured seconds (load.duration_s)"),
    request_timeout: Optional[float] = typer.Option(None, "--request-timeout", help="seconds from send to a "
                                                    "request's last byte, at most (target.request_timeout_s, "
                                                    "default 600)"),
    drain_timeout: Optional[float] = typer.Option(None, "--drain-timeout", help="seconds in-flight requests get "
                                                  "after the last send before the run ends (load.drain_timeout_s, "
                                                  "default 30)"),
    set_: list[str] = typer.Option([], "--set", help="override any field: --set load.rate_per_s=8 (repeatable)"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no live progress bar"),
    no_png: bool = typer.Option(False, "--no-png", help="skip the PNG copies of the charts (charts/*.png, linked "
                                "from summary.md); report.html is written either way"),
    no_server_metrics: bool = typer.Option(False, "--no-server-metrics", help="do not scrape the target's "
                                           "/metrics (default: every --server-metrics-period-s into "
                                           "server_metrics.parquet)"),
    server_metrics_period_s: float = typer.Option(0.5, "--server-metrics-period-s", min=0.05,
                                                  help="seconds between two scrapes of /metrics"),
    engine: str = typer.Option("asyncio", "--engine", help="asyncio (default) or locust (Locust users in front "
                               "of the same streaming engine; with --workers, Locust's master/worker mode)"),
    workers: int = typer.Option(0, "--workers", help="--engine locust: start N local worker processes (0: one "
                                "process)"),
    capture: int = typer.Option(0, "--capture", min=0, max=1000, help="keep the first N failed responses as received "
                                "(headers as sent, body de-chunked and decoded, redacted) in the run directory's "
                                "captures/"),
    no_fail_fast: bool = typer.Option(False, "--no-fail-fast", help="run the whole plan even when the first "
                                      "requests all fail (default: stop after load.fail_fast_requests, 10)"),
    repeat: int = typer.Option(1, "--repeat", min=1, help="N runs (2-100), seeds seed…seed+N-1, in OUT/run-NN-seedS/, "
                               "and one combined verdict and report (repeat.json, repeat.html; docs/verdicts.md)"),
) -> None:
    """Run a scenario, write the run directory and print the verdict (--repeat N: N runs, one verdict)."""
    if engine not in ("asyncio", "locust"):
        raise fail(f"--engine {engine!r}: choose asyncio or locust")
    if workers < 0 or (workers and engine != "locust"):
        raise fail("--workers N needs --engine locust and N >= 0")
    if capture and workers:
        raise fail("--capture keeps what this process received: it works without --workers")
    if out is not None:
        check_out_dir(out)
    if engine == "locust":  # first: Locust monkey-patches the process when imported
        importlib.import_module("loadgen.run.locust_run")

    try:
        overrides = scenario_overrides(set_, base_url, model, api_key_env, seconds={
            "load.duration_s": duration, "target.request_timeout_s": request_timeout,
            "load.drain_timeout_s": drain_timeout}) + (["load.fail_fast_requests=0"] if no_fail_fast else [])
        sc = load(scenario, overrides)
        if repeat > 1:
            raise typer.Exit(_repeat(sc, repeat, out, engine, workers, no_progress, no_png, no_server_metrics))
        result = api.run(sc, out=out, engine=engine, workers=workers, progress=not no_progress,  # type: ignore
                         png=not no_png, server_metrics=not no_server_metrics,
                         server_metrics_period_s=server_metrics_period_s, capture=capture, console=console)
    except (ScenarioError, api.TargetError) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(result.exit_code)


def _repeat(sc: api.Scenario, n: int, out: Optional[Path], engine: str, workers: int, no_progress: bool,
            no_png: bool, no_server_metrics: bool) -> int:
    """run --repeat N: N runs and their combined verdict's exit code."""
    many = api.repeat(sc, n, out=out, engine=engine, workers=workers, progress=not no_progress,  # type: ignore
                      png=not no_png, server_metrics=not no_server_metrics, console=console)
    return many.exit_code
