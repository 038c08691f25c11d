"""``loadgen size SCENARIO [--from RUN]``: how many requests, and how long, a run needs to certify each objective
and for ``compare`` to detect a regression (docs/verdicts.md, Sizing a run)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from loadgen.cli.common import LEVEL, console, fail, load, percent_option, points, scenario_overrides, seconds_option
from loadgen.errors import InputError


def size(
    scenario: Optional[Path] = typer.Argument(None, help="scenario file (YAML): its pilot is run on its target, "
                                              "unless --from gives a run; with --from, its objectives are "
                                              "judged on that run's records"),
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
    base_url: Optional[str] = typer.Option(None, "--base-url", help="the pilot's target (default the "
                                           "scenario's; 'embedded' starts the bundled simulator)"),
    as_json: bool = typer.Option(False, "--json/--no-json", help="print the sizing as JSON (for machines)"),
) -> None:
    """Size a run from a pilot: per objective, the samples, requests and seconds (at the pilot's request rate)
    needed to certify it (PASS or FAIL, the way the pilot points) at --confidence with --power, accounting
    for the autocorrelation the pilot measured (design effect, dispersion); the requests per run for compare to
    detect a --regression; then the load.duration_s and load.requests to set. Exit 0; 2 on bad input."""
    from loadgen import api

    if scenario is None and from_run is None:
        raise fail("give a scenario file, or a run directory with --from")
    try:
        sc = load(scenario, scenario_overrides(sets, base_url)) if scenario is not None else None
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
