"""``loadgen advise RUN_DIR``: which server setting would meet the SLOs, from a measured run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from loadgen.cli.common import console, fail, percent_option, points
from loadgen.errors import AdviceError, SettingsError


def advise(
    run_dir: Path = typer.Argument(..., help="a run directory (loadgen run's output)"),
    try_: Optional[list[str]] = typer.Option(None, "--try", help="candidate values of a server setting, "
                                             "KEY=V1,V2 (repeatable; the grid is their product): chunked_prefill, "
                                             "max_num_batched_tokens, max_num_seqs, waiting_served_ratio, "
                                             "max_waiting_tokens. Default: chunked prefill off, and on with "
                                             "budgets 256…8192, at the current max_num_seqs"),
    server: Optional[list[str]] = typer.Option(None, "--server", help="what the run's server ran with, "
                                               "KEY=VALUE (repeatable; same keys). Read from run.json for the "
                                               "embedded simulator; else the engine's defaults are assumed"),
    capacity: bool = typer.Option(False, "--capacity/--no-capacity", help="also search each candidate's capacity "
                                  "on the "
                                  "calibrated simulator: the highest request rate (a multiple of the run's) that "
                                  "meets every objective; it then ranks the candidates. Open-loop runs"),
    replays: int = typer.Option(20, "--replays", help="replays per candidate, each under its own step-noise seed "
                              "(the scenario's seed, then the next ones); a candidate must keep the margin in 95 % "
                              "of them. The main job: ~0.5 s a replay; a candidate stops once it cannot qualify"),
    margin: float = percent_option("10%", "--margin", "the share of each objective's limit the recommended "
                                   "setting must keep in its replays (a <= objective: value <= limit × (1 − "
                                   "margin)); the stall objectives count gaps within the margin of the stall "
                                   "threshold too. 0%: just meet every objective", legacy="percent",
                                   check=(lambda x: 0 <= x < 1, "a percentage from 0% to below 100%")),
    png: bool = typer.Option(True, "--png/--no-png", help="re-render the report's PNG charts too"),
) -> None:
    """Fit the simulator's cost model to a run, replay the run's own plan under each candidate server setting
    (--replays times each) and recommend the one that keeps --margin on every objective the replay can move in
    95 % of its replays with the most goodput, with its flags; when none does, say so and show the closest. The
    error rate (errors, timeouts and the network are not modelled) is judged once, on the measured run, and
    rules no setting out. Writes advice.json and advice.md in RUN_DIR and adds an advice section to its
    report.html. Exit 0: a setting keeps the margin; 1: none does; 2: bad input."""
    from loadgen import api  # here, not at the top: `loadgen --help` starts without the analysis (cli/app.py)
    from loadgen.report.advice_report import console_lines, console_tables, recommendation_lines

    try:
        with console.status("advise: fitting the cost model") as status:
            result = api.advise(run_dir, tries=try_ or (), server=server or (), capacity=capacity, png=png,
                                seeds=replays, margin_pct=points(margin),
                                progress=lambda line: status.update(f"advise: {line}"))
    except (AdviceError, SettingsError) as exc:
        raise fail(str(exc)) from None
    for table in console_tables(result):
        console.print(table)
        console.print()
    for line in console_lines(result):
        console.print(line, markup=False, highlight=False)
    if result.costs:
        console.print("what it changes against the current setting (both replayed):")
    for line in result.costs:
        console.print(f"  {line}", markup=False, highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    first, *rest = recommendation_lines(result)
    console.print(first, style="bold", markup=False, highlight=False)
    for line in rest:
        console.print(line, markup=False, highlight=False)
    console.print(f"({run_dir / 'advice.md'})", markup=False, highlight=False)
    raise typer.Exit(result.exit_code)
