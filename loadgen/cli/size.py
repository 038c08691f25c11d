"""``loadgen size [SCENARIO] [--from RUN]``: how many requests, and how long, a run needs to certify each objective
and for ``compare`` to detect a regression (docs/verdicts.md, Sizing a run). Without a scenario or --from, the
pilot is run's quick start (--base-url and run's flags: cli/quickstart.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from loadgen.cli import quickstart
from loadgen.cli.common import LEVEL, console, fail, percent_option, points, seconds_option
from loadgen.cli.quickstart import Given, Loads
from loadgen.errors import InputError

if TYPE_CHECKING:
    from loadgen.plan.scenario import Scenario

RATE = typer.Option(None, "--rate", metavar="REQ/S", parser=quickstart.loads("--rate", "number"),
                    help="the pilot's requests per second, as in run (quick start: 1)")
CONCURRENCY = typer.Option(None, "--concurrency", metavar="N", parser=quickstart.loads("--concurrency", "count"),
                           help="the pilot's closed loop of N users, as in run")


def size(
    scenario: Optional[Path] = typer.Argument(None, help="scenario file (YAML): its pilot is run on its target, "
                                              "unless --from gives a run; with --from, its objectives are "
                                              "judged on that run's records; none: run's quick start "
                                              "from --base-url and its flags"),
    from_run: Optional[Path] = typer.Option(None, "--from", help="a run directory to size from (its "
                                            "summary.json and records) instead of running a pilot"),
    pilot_s: float = seconds_option("20s", "--pilot-duration", "measured time of the pilot (at the scenario's "
                                    "own load, after its warm-up)"),
    confidence: float = percent_option("95%", "--confidence", "confidence level the run is sized to certify at "
                                       "(the scenario's slo.confidence is the one its verdict uses)",
                                       legacy="fraction", check=LEVEL),
    power: float = percent_option("80%", "--power", "chance (1 − β) that the sized run certifies each objective",
                                  legacy="fraction", check=(LEVEL[0], "give a power from 50% to below 100%")),
    regression: float = percent_option("10%", "--regression", "the regression compare should detect, a "
                                       "percentage of each statistic", legacy="percent"),
    compare_threshold: float = percent_option("0%", "--threshold", "compare's --threshold the regression must "
                                              "clear: the change sized is regression − this", legacy="percent"),
    assurance: float = percent_option("80%", "--pilot-assurance", "the pilot is a sample too: its estimate is "
                                      "taken at its one-sided bound at this level toward the limit, so that the "
                                      "size holds for most pilots (50%: at the estimate itself)",
                                      legacy="fraction", check=LEVEL),
    sets: list[str] = typer.Option([], "--set", help="override any scenario field, e.g. --set "
                                   "load.rate_per_s=8 (repeatable)"),
    base_url: Optional[str] = quickstart.base_url_option("the pilot's target (default the scenario's; "
                                                         "'embedded' starts the bundled simulator)"),
    model: Optional[str] = quickstart.MODEL, api_key_env: Optional[str] = quickstart.API_KEY_ENV,
    rate: Optional[Loads] = RATE, concurrency: Optional[Loads] = CONCURRENCY,
    prompt_tokens: Optional[int] = quickstart.PROMPT_TOKENS, output_tokens: Optional[int] = quickstart.OUTPUT_TOKENS,
    spread: Optional[float] = quickstart.SPREAD, dataset: Optional[Path] = quickstart.DATASET,
    slo: list[str] = quickstart.SLO, api_: Optional[str] = quickstart.API,
    request_timeout: Optional[float] = quickstart.REQUEST_TIMEOUT,
    as_json: bool = typer.Option(False, "--json/--no-json", help="print the sizing as JSON (for machines)"),
) -> None:
    """Size a run from a pilot: per objective, the samples, requests and seconds (at the pilot's request rate)
    needed to certify it (PASS or FAIL, the way the pilot points) at --confidence with --power, accounting
    for the autocorrelation the pilot measured (design effect, dispersion); the requests per run for compare to
    detect a --regression; then the load.duration_s and load.requests to set. Exit 0; 2 on bad input."""
    from loadgen import api

    given = Given(base_url, model, api_key_env, prompt_tokens, output_tokens, spread, dataset, slo, api_,
                  request_timeout_s=request_timeout, sets=sets)
    sc = _scenario(scenario, from_run, given, rate, concurrency)
    try:
        result = api.size(sc, from_run=from_run, confidence=confidence, power=power, regression_pct=points(regression),
                          compare_threshold_pct=points(compare_threshold), pilot_s=pilot_s, assurance=assurance,
                          console=None if as_json else console)
    except InputError as exc:
        raise fail(str(exc)) from None
    if as_json:
        from loadgen.run.size import write_json

        typer.echo(write_json(result))
        return
    print_size(result)


def _scenario(scenario: Optional[Path], from_run: Optional[Path], given: Given, rate: Optional[Loads],
              concurrency: Optional[Loads]) -> Optional[Scenario]:
    """The pilot's scenario (None: --from's run alone): a file's, or run's quick start, the flags over it."""
    for flag, values in (("--rate", rate), ("--concurrency", concurrency)):
        if values is not None and len(values) > 1:
            raise fail(f"{flag} {','.join(f'{v:g}' for v in values)}: size sizes one load; give one (a list of "
                       "loads is a sweep's)")
    given.check()
    if scenario is None and from_run is None and given.base_url is None:
        raise fail("give a scenario file, a run directory with --from, or --base-url URL (run's quick start, "
                   "e.g. loadgen size --base-url embedded)")
    if scenario is None and from_run is not None:
        if given.args() or rate or concurrency:
            raise fail("--from sizes that run's own scenario: give its flags with a scenario file, or drop them")
        return None
    q = given.load(rate[0] if rate else None, int(concurrency[0]) if concurrency else None)
    return quickstart.scenario(scenario, q, given.overrides())


def _n(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:,.0f}"


def print_size(result: object) -> None:
    from loadgen.analysis.size_result import SizeResult
    from loadgen.report.fit import fit

    assert isinstance(result, SizeResult)
    o = result.options
    table = Table(title=f"Sizing from {result.pilot} ({100 * o.confidence:g}% confidence, power {100 * o.power:g}%; "
                  f"pilot {result.request_rate_per_s:.3g} req/s, {result.tokens_per_request:.0f} tokens/request)")
    for col in ("objective", "pilot", "limit", "certifies", "samples", "requests", "seconds",
                f"compare {o.regression_pct:g}%"):
        table.add_column(col, justify="left" if col in ("objective", "certifies") else "right")
    notes = []
    for r in result.rows:
        unit = {"tokens": " tok", "seconds": " s"}.get(r.unit, "")
        extra = f"deff {r.deff:.2g}" if r.kind == "token quantile" else f"dispersion {r.deff:.2g}" \
            if r.kind == "rate" and r.deff > 1 else ""
        note = "; ".join(x for x in (extra, r.note) if x)
        if note:
            notes.append(f"{r.objective}: {note}")
        table.add_row(r.objective, "–" if r.value is None else f"{r.value:.4g}", f"{r.comparison} {r.limit:g}",
                      (r.decision or "–").upper() + ("" if r.reliable else " ?"),
                      _n(r.samples) + (unit if r.samples is not None else ""), _n(r.requests),
                      "–" if r.duration_s is None else f"{r.duration_s:,.0f}", _n(r.regression_requests))
    console.print(fit(console, table, ("objective", "certifies")))  # stacked, never cut, where it is narrow
    for note in notes + result.notes:
        console.print(f"note: {note}")
    if result.duration_s is None:
        console.print("[bold]no objective can be sized from this pilot[/bold]")
        return
    console.print(f"[bold]recommended: load.duration_s: {result.duration_s:g}  (load.requests: "
                  f"{result.requests:,})[/bold] at the pilot's load; or load.until: decided with "
                  f"load.max_duration_s: {math.ceil(1.5 * result.duration_s):g}")
