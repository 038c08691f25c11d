"""``loadgen sweep [SCENARIO]``: fixed load steps or a search for the highest load that meets the SLOs; without a
scenario, the quick start from run's flags (cli/quickstart.py), the load's steps from --rate/--concurrency."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from loadgen.cli import quickstart
from loadgen.cli.common import (LEVEL, check_out_dir, console, err, fail, percent_option, seconds_option,
                                workers_flag, workers_option)
from loadgen.cli.quickstart import Given
from loadgen.cli.vocabulary import FlagError, numbers
from loadgen.errors import ScenarioError

if TYPE_CHECKING:
    from loadgen.plan.scenario import Scenario


NO_ARGUMENT = """\
loadgen sweep needs a target or a scenario. A quick start, no file needed:
  loadgen sweep --base-url http://host:8000/v1 --model M --rate 1,2,4,8 --duration 20
  loadgen sweep --base-url embedded --rate 2,4,8 --duration 10   (the bundled simulator)
Or a scenario: loadgen scenario list shows the bundled ones, then
  loadgen sweep smoke --rate 2,4,8                 (a bundled one, by name)
  loadgen sweep my_scenario.yaml --find-max rate   (a file; sweep -h: all flags)"""


def _numbers(text: str, flag: str) -> list[float]:
    try:
        return numbers(text, flag)
    except FlagError as exc:
        raise fail(str(exc)) from None


def _check_flags(rates: Optional[str], concurrency: Optional[str], find_max: Optional[str], engine: str,
                 until: str, workers_: str) -> int:
    """The flags' combinations (exit 2); the number of sending processes."""
    if sum(x is not None for x in (rates, concurrency, find_max)) != 1:
        raise fail("give exactly one of --rate, --concurrency or --find-max rate|concurrency")
    if find_max is not None and find_max not in ("rate", "concurrency"):
        raise fail(f"--find-max {find_max!r}: choose rate or concurrency")
    if engine not in ("asyncio", "locust"):
        raise fail(f"--engine {engine!r}: choose asyncio or locust")
    if until not in ("time", "decided"):
        raise fail(f"--until {until!r}: choose time (each step its duration) or decided")
    if concurrency is not None and any(x != int(x) for x in _numbers(concurrency, "--concurrency")):
        raise fail(f"--concurrency {concurrency!r}: concurrent users are whole numbers")
    return workers_flag(workers_)


# the step-duration flags (docs/verdicts.md, "sweep"): one line each in the command's signature below
STEP_DURATION = seconds_option(None, "--step-duration", "measured time of each fixed step, exactly (default: "
                               "load.duration_s); a search sizes its steps itself (--min/--max-step-duration)")
UNTIL = typer.Option("time", "--until", help="time: every step runs the duration given; decided: an undecided "
                     "step runs again, as long as its objectives' samples need (at least 1.5x its last), up to "
                     "--max-step-duration; announced up front")
MAX_STEP = seconds_option(None, "--max-step-duration", "the longest step, for --until decided and for a "
                          "search's planner (default: 8x the step duration)")
MIN_STEP = seconds_option(None, "--min-step-duration", "a search's shortest step, its bracketing steps "
                          "(default: 10 s, or the step duration if shorter)")
DURATION = quickstart.duration_option("each step's measured time unless --step-duration gives it (load.duration_s; "
                                      "quick start: 30s)")


def _scenario(scenario: Optional[Path], given: Given, concurrency: Optional[str], find_max: Optional[str],
              start: Optional[float]) -> Scenario:
    """The sweep's scenario: the file's (a bundled one by name), or the quick start (closed loop for a
    concurrency sweep, from its first step), the quick flags over it as run applies them."""
    users = None
    if scenario is None and (concurrency is not None or find_max == "concurrency"):
        users = int(_numbers(concurrency, "--concurrency")[0]) if concurrency else int(start or 1)
    return quickstart.scenario(scenario, given.load(None, users), given.overrides())


# the load and search flags: one line each in the command's signature below
SCENARIO = typer.Argument(None, help="scenario file (YAML), or a bundled scenario's name; none: the quick start "
                          "from --base-url and run's flags")
RATES = typer.Option(None, "--rate", help="fixed steps of request rate, e.g. 1,2,4,8 (load.rate_per_s; on a "
                     "closed-loop scenario its ceiling load.max_rate_per_s)")
CONCURRENCY = typer.Option(None, "--concurrency", help="fixed steps of concurrent users, e.g. 4,8,16 "
                           "(load.concurrency; closed-loop scenarios; the quick start: a closed loop)")
FIND_MAX = typer.Option(None, "--find-max", help="search for the highest rate or concurrency that meets every SLO "
                        "with confidence: rate | concurrency")
REQUIRE = typer.Option(None, "--require", help="exit 0 only if the capacity is at least this (req/s or users); 1 "
                       "below it, 3 undecided")
TOLERANCE = percent_option("5%", "--tolerance", "the search stops when the capacity interval is this narrow "
                           "(share of its upper end)", legacy="percent",
                           check=(lambda x: 0.001 <= x <= 1, "between 0.1% and 100%"))
BUDGET = seconds_option("1h", "--budget", "wall time the sweep may take; a step that would not fit is not started")
START = typer.Option(None, "--start", help="the search's first load (default: the scenario's rate or concurrency)")
CONFIDENCE = percent_option(None, "--confidence", "confidence level of every step's objective intervals, e.g. 95% "
                            "(default: the scenario's slo.confidence)", legacy="fraction", check=LEVEL)


def sweep(
    scenario: Optional[Path] = SCENARIO, rates: Optional[str] = RATES, concurrency: Optional[str] = CONCURRENCY,
    find_max: Optional[str] = FIND_MAX, require: Optional[float] = REQUIRE, tolerance: float = TOLERANCE,
    budget_s: float = BUDGET,
    max_steps: int = typer.Option(20, "--max-steps", help="steps at most (a load run again counts again)"),
    start: Optional[float] = START, step_duration: Optional[float] = STEP_DURATION, until: str = UNTIL,
    max_step_duration_s: Optional[float] = MAX_STEP, min_step_duration_s: Optional[float] = MIN_STEP,
    confidence: Optional[float] = CONFIDENCE,
    base_url: Optional[str] = quickstart.base_url_option("as in run ('embedded': the bundled simulator)"),
    model: Optional[str] = quickstart.MODEL, api_key_env: Optional[str] = quickstart.API_KEY_ENV,
    prompt_tokens: Optional[int] = quickstart.PROMPT_TOKENS, output_tokens: Optional[int] = quickstart.OUTPUT_TOKENS,
    spread: Optional[float] = quickstart.SPREAD, dataset: Optional[Path] = quickstart.DATASET,
    slo: list[str] = quickstart.SLO, api_: Optional[str] = quickstart.API, duration: Optional[float] = DURATION,
    request_timeout: Optional[float] = quickstart.REQUEST_TIMEOUT,
    drain_timeout: Optional[float] = quickstart.DRAIN_TIMEOUT,
    out: Optional[Path] = typer.Option(None, "--out", help="the sweep's directory (default "
                                       "reports/<time>-<name>-sweep)"),
    set_: list[str] = typer.Option([], "--set", help="override any field (repeatable), as in run"),
    engine: str = typer.Option("asyncio", "--engine", help="asyncio or locust, as in run"),
    workers_: str = workers_option("sending processes per step, N or auto (default 1), as in run"),
    png: bool = typer.Option(True, "--png/--no-png", help="each step's chart PNGs too"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="a live progress bar per step"),
) -> None:
    """Run the scenario at several loads and find the highest that meets its SLOs. Fixed steps run exactly
    the duration given (longer only with --until decided); a search brackets with short steps, then bisects
    and places each next step where it narrows the capacity most: the load where each objective's curve,
    fitted monotone over every step, crosses its limit, with an interval, within --budget. Writes every step's
    run directory, sweep.json, summary.md, junit.xml and sweep.html. Without a scenario: run's quick start.
    Exit 0: capacity meets --require (without one: fixed steps all passed, a search bracketed it); 1: below
    it, a step failed or no load passed; 2: bad input; 3: not decided, not a failure (a step had too few
    samples: the last line names the --step-duration that decides it; or no capacity bracketed within the
    budget)."""
    from loadgen import api  # here, not at the top: `loadgen --help` starts without it (cli/app.py)
    if scenario is None and base_url is None:
        err.print(NO_ARGUMENT, highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2)
    workers = _check_flags(rates, concurrency, find_max, engine, until, workers_)
    given = Given(base_url, model, api_key_env, prompt_tokens, output_tokens, spread, dataset, slo, api_, duration,
                  request_timeout, drain_timeout, set_)
    given.check()
    if out is not None:
        check_out_dir(out)
    if engine == "locust":  # first: Locust monkey-patches the process when imported
        importlib.import_module("loadgen.run.locust_run")
    try:
        sc = _scenario(scenario, given, concurrency, find_max, start)
        result = api.sweep(sc, rates=_numbers(rates, "--rate") if rates else None,
                           concurrency=[int(x) for x in _numbers(concurrency, "--concurrency")] if concurrency
                           else None, find_max=find_max, require=require,  # type: ignore[arg-type]
                           tolerance=tolerance, budget_s=budget_s, max_steps=max_steps, start=start,
                           step_duration_s=step_duration, until=until,  # type: ignore[arg-type]
                           max_step_duration_s=max_step_duration_s, min_step_duration_s=min_step_duration_s,
                           confidence=confidence, out=out, engine=engine, workers=workers, png=png,
                           progress=progress, console=console)  # type: ignore[arg-type]
    except (ScenarioError, api.TargetError) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(result.exit_code)
