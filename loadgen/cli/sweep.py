"""``loadgen sweep SCENARIO``: fixed load steps or a search for the highest load that meets the SLOs."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Optional

import typer

from loadgen import api
from loadgen.cli.common import check_out_dir, console, fail, load, scenario_overrides
from loadgen.plan.scenario import ScenarioError


def _numbers(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise fail(f"{flag} {text!r}: give numbers separated by commas, e.g. {flag} 1,2,4,8") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise fail(f"{flag} {text!r}: every step must be a finite number above 0")
    return values


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / 100
    except ValueError:
        raise fail(f"--tolerance {text!r}: a percentage, e.g. 5%") from None
    if not 0.001 <= value <= 1:
        raise fail(f"--tolerance {text!r}: between 0.1% and 100%")
    return value


def _check_flags(rates: Optional[str], concurrency: Optional[str], find_max: Optional[str], engine: str,
                 workers: int, durations: dict[str, Optional[float]], until: str) -> None:
    if sum(x is not None for x in (rates, concurrency, find_max)) != 1:
        raise fail("give exactly one of --rates, --concurrency or --find-max rate|concurrency")
    if find_max is not None and find_max not in ("rate", "concurrency"):
        raise fail(f"--find-max {find_max!r}: choose rate or concurrency")
    if engine not in ("asyncio", "locust"):
        raise fail(f"--engine {engine!r}: choose asyncio or locust")
    if workers < 0 or (workers and engine != "locust"):
        raise fail("--workers N needs --engine locust and N >= 0")
    for flag, seconds in durations.items():
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            raise fail(f"{flag} {seconds}: give a finite number of seconds above 0")
    if until not in ("time", "decided"):
        raise fail(f"--until {until!r}: choose time (each step its duration) or decided")
    if concurrency is not None and any(x != int(x) for x in _numbers(concurrency, "--concurrency")):
        raise fail(f"--concurrency {concurrency!r}: concurrent users are whole numbers")


# the step-duration flags (docs/verdicts.md, "sweep"): one line each in the command's signature below
STEP_DURATION = typer.Option(None, "--step-duration-s", help="measured seconds of each fixed step, exactly (default: "
                             "load.duration_s); a search sizes its steps itself (--min/--max-step-duration-s)")
UNTIL = typer.Option("time", "--until", help="time: every step runs the duration given; decided: an undecided "
                     "step runs again, as long as its objectives' samples need (at least 1.5x its last), up to "
                     "--max-step-duration-s; announced up front")
MAX_STEP = typer.Option(None, "--max-step-duration-s", help="the longest step, for --until decided and for a "
                        "search's planner (default: 8x the step duration)")
MIN_STEP = typer.Option(None, "--min-step-duration-s", help="a search's shortest step, its bracketing steps "
                        "(default: 10 s, or the step duration if shorter)")


def sweep(
    scenario: Path = typer.Argument(..., help="scenario file (YAML)"),
    rates: Optional[str] = typer.Option(None, "--rates", help="fixed steps of request rate, e.g. 1,2,4,8 "
                                        "(load.rate_per_s; on a closed-loop scenario its ceiling "
                                        "load.max_rate_per_s)"),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="fixed steps of concurrent users, "
                                              "e.g. 4,8,16 (load.concurrency; closed-loop scenarios)"),
    find_max: Optional[str] = typer.Option(None, "--find-max", help="search for the highest rate or "
                                           "concurrency that meets every SLO with confidence: rate | concurrency"),
    require: Optional[float] = typer.Option(None, "--require", help="exit 0 only if the capacity is at least "
                                            "this (req/s or users); 1 below it, 3 undecided"),
    tolerance: str = typer.Option("5%", "--tolerance", help="the search stops when the capacity interval is "
                                  "this narrow (share of its upper end)"),
    budget_s: float = typer.Option(3600.0, "--budget-s", help="wall seconds the sweep may take; a step that "
                                   "would not fit is not started"),
    max_steps: int = typer.Option(20, "--max-steps", help="steps at most (a load run again counts again)"),
    start: Optional[float] = typer.Option(None, "--start", help="the search's first load (default: the "
                                          "scenario's rate or concurrency)"),
    step_duration: Optional[float] = STEP_DURATION,
    until: str = UNTIL,
    max_step_duration_s: Optional[float] = MAX_STEP,
    min_step_duration_s: Optional[float] = MIN_STEP,
    confidence: Optional[float] = typer.Option(None, "--confidence", help="confidence level of every step's "
                                               "objective intervals (default: the scenario's slo.confidence)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="as in run"),
    model: Optional[str] = typer.Option(None, "--model", help="as in run"),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="as in run"),
    out: Optional[Path] = typer.Option(None, "--out", help="the sweep's directory (default "
                                       "reports/<time>-<name>-sweep)"),
    set_: list[str] = typer.Option([], "--set", help="override any field (repeatable), as in run"),
    engine: str = typer.Option("asyncio", "--engine", help="asyncio or locust, as in run"),
    workers: int = typer.Option(0, "--workers", help="--engine locust: N local worker processes"),
    png: bool = typer.Option(False, "--png", help="also write each step's chart PNGs"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no live progress bar per step"),
) -> None:
    """Run the scenario at several loads and find the highest that meets its SLOs. Fixed steps run exactly
    the duration given (longer only with --until decided); a search brackets with short steps, then bisects
    with steps sized to decide their objectives, within --budget-s. Writes every step's run directory,
    sweep.json, summary.md, junit.xml and sweep.html. Exit 0: capacity meets --require (or, without
    one, was bracketed); 1: below it or no load passed; 2: bad input; 3: undecided within the budget."""
    _check_flags(rates, concurrency, find_max, engine, workers,
                 {"--step-duration-s": step_duration, "--max-step-duration-s": max_step_duration_s,
                  "--min-step-duration-s": min_step_duration_s}, until)
    if out is not None:
        check_out_dir(out)
    if engine == "locust":  # first: Locust monkey-patches the process when imported
        importlib.import_module("loadgen.run.locust_run")
    try:
        sc = load(scenario, scenario_overrides(set_, base_url, model, api_key_env))
        result = api.sweep(sc, rates=_numbers(rates, "--rates") if rates else None,
                           concurrency=[int(x) for x in _numbers(concurrency, "--concurrency")] if concurrency
                           else None, find_max=find_max, require=require,  # type: ignore[arg-type]
                           tolerance=_percent(tolerance), budget_s=budget_s, max_steps=max_steps, start=start,
                           step_duration_s=step_duration, until=until,  # type: ignore[arg-type]
                           max_step_duration_s=max_step_duration_s, min_step_duration_s=min_step_duration_s,
                           confidence=confidence, out=out, engine=engine, workers=workers, png=png,
                           progress=not no_progress, console=console)  # type: ignore[arg-type]
    except (ScenarioError, api.TargetError) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(result.exit_code)
