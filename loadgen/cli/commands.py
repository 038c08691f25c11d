"""The top-level commands of the ``loadgen`` command line: ui, worker, validate, schema, check, report, compare,
history (``run`` is cli/run.py). Each parses its flags and calls ``loadgen.api``; cli/app.py registers them. Exit
codes (run/exits.py): 0 pass, 1 SLO failed, 2 usage/config error (nothing sent), 3 inconclusive or interrupted, 4
internal error."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path
from typing import Optional

import typer

from loadgen.cli.common import LEVEL, console, fail, load, percent_option, points, scenario_overrides
from loadgen.core.secrets import redact_url, write_text
from loadgen.errors import ScenarioError


def ui(
    scenario: Path = typer.Argument(..., help="scenario file (YAML)"),
    host: str = typer.Option("127.0.0.1", "--host", help="the web UI's interface"),
    port: int = typer.Option(8089, "--port", help="the web UI's port"),
    web_login: bool = typer.Option(False, "--web-login/--no-web-login", help="protect the web UI with Locust's "
                                   "login page"),
    master: bool = typer.Option(False, "--master/--no-master", help="run as a Locust master; start workers with "
                                "`loadgen worker SCENARIO --master-host HOST`"),
    master_port: int = typer.Option(5557, "--master-bind-port", help="the master's port for workers"),
    master_bind_host: str = typer.Option("127.0.0.1", "--master-bind-host", help="the master's interface for "
                                         "workers (default loopback only: Locust's worker protocol has no "
                                         "authentication; give 0.0.0.0 or an address only on a trusted network)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="as in run"),
    set_: list[str] = typer.Option([], "--set", help="override any field, as in run"),
    png: bool = typer.Option(True, "--png/--no-png", help="as in run"),
    reports_dir: Path = typer.Option(Path("reports"), "--reports", help="each run goes to "
                                     "REPORTS/<time>-<name>/"),
) -> None:
    """Locust's web UI with the scenario loaded and an LLM tab (exact TTFT/ITL/TPOT percentiles, stalls, SLOs,
    live). Start and stop from the browser; each run is written like `loadgen run`'s."""
    importlib.import_module("loadgen.run.locust_ui")  # first: Locust monkey-patches the process when imported
    from loadgen import api  # in each command, not at the top: `loadgen --help` starts without it (cli/app.py)
    try:
        api.ui(load(scenario, scenario_overrides(set_, base_url)), host=host, port=port, web_login=web_login,
               master=master, master_bind=(master_bind_host, master_port), reports_dir=reports_dir,
               png=png, console=console)
    except (ScenarioError, api.TargetError) as exc:
        raise fail(str(exc)) from None


def worker(
    scenario: Path = typer.Argument(..., help="the scenario file the master runs"),
    master_host: str = typer.Option("127.0.0.1", "--master-host", help="the Locust master's address"),
    master_port: int = typer.Option(5557, "--master-port", help="the Locust master's port"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="the target as this worker reaches it "
                                           "(default: the scenario's; 'embedded' is not allowed here)"),
    set_: list[str] = typer.Option([], "--set", help="the same overrides as the master's"),
) -> None:
    """A Locust worker: streams its slice of the scenario's plan and ships the raw records to the master."""
    from loadgen.run import locust_run  # first: Locust monkey-patches the process when imported
    from loadgen import api
    from loadgen.run.target import TargetError

    try:
        sc = load(scenario, scenario_overrides(set_, base_url))
        api.refuse_locust_sessions(sc, "a Locust worker cannot send them; run it with loadgen run")
        if sc.target.embedded:
            raise fail("a worker needs the target's URL (--base-url): the master's simulator is not shared")
        raise typer.Exit(locust_run.run_worker(sc, master_host, master_port))
    except (ScenarioError, TargetError) as exc:
        raise fail(str(exc)) from None


def validate(
    scenario: Path = typer.Argument(..., help="scenario file (YAML)"),
    set_: list[str] = typer.Option([], "--set", help="override any field, as in run"),
) -> None:
    """Validate a scenario file without sending anything: print its plan's size, or exit 2 naming the bad
    field, value and line. (To audit the endpoint itself, use `loadgen check`.)"""
    from loadgen.plan.schedule import build_plan
    from loadgen.plan.until_spec import horizon

    try:
        sc = load(scenario, set_)
        plan = build_plan(horizon(sc))  # until: decided: the plan made for its maximum
    except ScenarioError as exc:
        raise fail(str(exc)) from None
    size = plan.size if plan.size is not None else f"closed loop × {sc.load.concurrency}"
    end_s = plan.hard_end_s(sc.load.drain_timeout_s)
    bound = (f"ends at most {end_s:.1f} s after its first send" if end_s is not None else
             f"each request ends within {sc.target.request_timeout_s:g} s")
    console.print(f"{scenario}: ok — {sc.name}, {size} requests planned, {len(sc.workload.classes)} class(es), "
                  f"target {redact_url(sc.target.base_url)}; {bound}", highlight=False)


def schema(
    out: Optional[Path] = typer.Option(None, "--out", help="write it to this file (default: print it)"),
    markdown: bool = typer.Option(False, "--markdown/--no-markdown", help="the scenario reference "
                                  "(docs/scenario.md) generated from the schema, instead of the schema"),
) -> None:
    """Print the scenario file's JSON Schema (editors validate and complete scenarios with it:
    scenarios/scenario.schema.json), or with --markdown the scenario reference generated from it."""
    from loadgen.plan.schema_doc import scenario_schema, schema_json, schema_markdown

    text = (schema_markdown if markdown else schema_json)(scenario_schema())
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        write_text(out, text)
    except OSError as exc:
        raise fail(f"{out}: cannot write: {exc.strerror}") from None
    typer.echo(f"wrote {out}", err=True)


def check(
    scenario: Optional[Path] = typer.Argument(None, help="scenario file (YAML), as run takes; without one, a "
                                              "built-in minimal scenario for --base-url"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="as in run ('embedded': the bundled "
                                           "simulator)"),
    model: Optional[str] = typer.Option(None, "--model", help="as in run"),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="environment variable with the API key"),
    api_: Optional[str] = typer.Option(None, "--api", help="chat or completions (default: the scenario's; "
                                       "built-in: chat)"),
    json_out: bool = typer.Option(False, "--json/--no-json", help="print one JSON object (findings, verdict, exit "
                                  "code)"),
    verbose: bool = typer.Option(False, "--verbose/--no-verbose", help="each line's evidence (the figures it was "
                                 "judged on) under it"),
    set_: list[str] = typer.Option([], "--set", help="override any field, as in run"),
) -> None:
    """Audit whether an endpoint can be measured honestly (streaming, coalescing, caching, usage, tokenizer,
    HTTP, largest prompt) in well under a minute. Exit 0 clean, 1 findings that limit what can be measured, 2
    unreachable or not OpenAI-compatible."""
    from loadgen import api
    from loadgen.report.check_report import print_check
    from loadgen.run.check import builtin_scenario

    if scenario is None and base_url is None:
        raise fail("give a scenario file or --base-url URL (loadgen check --help)")
    try:
        if api_ is not None and api_ not in ("chat", "completions"):
            raise ScenarioError(f"--api {api_!r}: choose chat or completions")
        overrides = scenario_overrides(set_, base_url, model, api_key_env) + ([f"target.api={api_}"] if api_ else [])
        sc = load(scenario, overrides) if scenario else builtin_scenario(lambda p: load(p, overrides))
        result = api.check(sc)
    except (ScenarioError, api.TargetError) as exc:
        if json_out:
            said = "unusable" if isinstance(exc, api.TargetError) else "bad input"
            typer.echo(json.dumps({"verdict": said, "exit_code": 2, "error": str(exc), "findings": []}))
        raise fail(str(exc)) from None
    if json_out:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        print_check(console, result, verbose)
    raise typer.Exit(result.exit_code)


def report(
    run_dir: Path = typer.Argument(..., help="a run directory (reports/<run_id>)"),
    window: Optional[str] = typer.Option(None, "--window", help="the request timeline's window, START:END in "
                                         "seconds since the run's start (default: around the worst stall)"),
    png: bool = typer.Option(True, "--png/--no-png", help="the PNG copies of the charts"),
) -> None:
    """Recompute the summary, verdict and every report (report.html, summary.md/json, junit.xml, charts) from
    the run's Parquet records."""
    from loadgen import api
    if not run_dir.is_dir():  # what is wrong with the path first: a typo is not a directory without run.json
        runs = sorted(run_dir.parent.glob("*/run.json")) if run_dir.parent.is_dir() else []
        hint = f"; the latest run beside it: loadgen report {shlex.quote(str(runs[-1].parent))}" if runs else ""
        raise fail(f"{run_dir}: {'not a directory' if run_dir.exists() else 'no such directory'}{hint}")
    from loadgen.report.console import print_summary
    from loadgen.report.timeline import parse_window

    try:
        span = parse_window(window) if window else None
        result = api.report(run_dir, window=span, png=png)
    except (FileNotFoundError, ScenarioError, ValueError) as exc:
        raise fail(str(exc)) from None
    print_summary(console, result, str(run_dir))
    raise typer.Exit(result.exit_code)


def compare(
    base: Path = typer.Argument(..., help="the baseline run directory"),
    new: Path = typer.Argument(..., help="the run directory to judge"),
    threshold: float = percent_option("10%", "--threshold", "a latency or throughput metric regressed when its "
                                      "whole confidence interval is worse by more", legacy="percent",
                                      check=(lambda x: x >= 0, "give a percentage of 0% or more")),
    error_rate_delta: Optional[float] = percent_option(None, "--error-rate-delta", "percentage points, the same "
                                                       "for the error rate, e.g. 1% (default: half of the "
                                                       "scenario's slo.error_rate.max; 1% when neither run sets "
                                                       "one)", legacy="percent"),
    stall_rate_delta: Optional[float] = typer.Option(None, "--stall-rate-delta", help="stalls per 1k output "
                                                     "tokens: a stall rate regressed when its interval is above "
                                                     "by more (default: half of the scenario's stall limit, e.g. "
                                                     "max_prefill_induced_per_1k_tokens 0.1 → 0.05; 0.5 when "
                                                     "neither run sets one)"),
    confidence: float = percent_option("95%", "--confidence", "confidence level of the bootstrap intervals",
                                       legacy="fraction", check=LEVEL),
    replicates: int = typer.Option(1000, "--replicates", help="bootstrap replicates (requests resampled)"),
    metric: list[str] = typer.Option([], "--metric", help="compare only these (repeatable), e.g. itl_ms.p99; "
                                     "default: TTFT p50/p99, ITL p50/p99, TPOT p50, E2E p99, tokens/s, error "
                                     "rate, stalls per 1k tokens"),
    out: Optional[Path] = typer.Option(None, "--out", help="where compare.md/compare.json go (default: NEW)"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed (results are reproducible)"),
) -> None:
    """Say first whether the verdict changed (BASE's → NEW's, and which objectives changed decision), then per
    metric whether NEW regressed against BASE, with bootstrap confidence intervals from both runs' raw records.
    BASE or NEW may be a `run --repeat` directory (its runs pooled). Writes compare.json, compare.md,
    compare.html and compare-junit.xml. Exit 0 no regression and the verdict not worse; 1 a metric regressed
    or the verdict got worse (pass → inconclusive/fail, inconclusive → fail); 2 bad input."""
    from loadgen import api
    from loadgen.report.compare_report import print_comparison

    try:
        comparison = api.compare(base, new, metrics=metric or None, threshold_pct=points(threshold),
                                 error_rate_pp=None if error_rate_delta is None else points(error_rate_delta),
                                 stall_rate_delta=stall_rate_delta,
                                 confidence=confidence, replicates=replicates, seed=seed, out=out or new)
    except (api.CompareError, ScenarioError) as exc:
        raise fail(str(exc)) from None
    print_comparison(console, comparison.doc, comparison.results)
    raise typer.Exit(comparison.exit_code)


def history(
    reports_dir: Path = typer.Argument(Path("reports"), help="a directory of run directories"),
    out: Optional[Path] = typer.Option(None, "--out", help="the page to write (default REPORTS_DIR/history.html)"),
    scenario: Optional[str] = typer.Option(None, "--scenario", help="only runs of this scenario"),
) -> None:
    """Draw the trends of the key percentiles and verdicts across runs (one self-contained HTML page)."""
    import polars as pl

    from loadgen.report.history import collect_runs, print_history, render_history

    if not reports_dir.is_dir():
        raise fail(f"{reports_dir}: not a directory")
    runs = collect_runs(reports_dir)
    if scenario:
        runs = runs.filter(pl.col("scenario") == scenario)
    if runs.is_empty():
        raise fail(f"{reports_dir}: no run directories (summary.json + run.json)"
                    + (f" of scenario {scenario!r}" if scenario else ""))
    page = out or reports_dir / "history.html"
    write_text(page, render_history(runs, page, reports_dir))
    print_history(console, runs)
    console.print(f"{runs.height} runs → {page}", highlight=False)
