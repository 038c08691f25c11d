"""``loadgen shrink RUN``: the smallest set of a run's requests that still reproduces one of its stalls."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from loadgen.cli.common import check_out_dir, console, err, fail, percent_option, seconds_option
from loadgen.errors import RunDirError

if TYPE_CHECKING:
    from loadgen.shrink.search import ShrinkResult


def shrink(
    run_dir: Path = typer.Argument(..., help="a run directory (loadgen run's output)"),
    stall: Optional[int] = typer.Option(None, "--stall", help="the stall's row in stalls.parquet, from 0 "
                                        "(default: the worst stall, the largest gap; of the streams that one engine "
                                        "step stalled as long, the one sent last)"),
    request: Optional[int] = typer.Option(None, "--request", help="a request's seq in requests.parquet: its "
                                          "worst chunk gap; its TTFT where misses.parquet says it missed by "
                                          "TTFT (or it streamed under two chunks)"),
    out: Optional[Path] = typer.Option(None, "--out", help="where the reproduction goes (default "
                                       "RUN/shrink-<event>/)"),
    max_tries: int = typer.Option(200, "--max-tries", help="virtual-time replays the search may make"),
    timeout_s: float = seconds_option("10m", "--timeout", "time for the search and the confirmations: "
                                    "no replay or confirmation run starts after them, except the final set's first "
                                    "confirmation, so the command ends within --timeout plus one confirmation run "
                                    "(the set's span + the scenario's load.drain_timeout_s + the target's start)"),
    confirmations: int = typer.Option(5, "--confirmations", help="runs of the reduced set on the run's target "
                                      "(the embedded simulator as the run started it, or its URL); 80 % of them "
                                      "(4 of 5) must reproduce. 0: the virtual-time replay only"),
    share: float = percent_option("50%", "--share", "the share of the original gap the victim's worst gap must "
                                  "reach to count as reproduced", legacy="percent",
                                  check=(lambda x: 0 < x <= 1, "a percentage above 0%, at most 100%")),
    png: bool = typer.Option(True, "--png/--no-png", help="render figure.png (its Vega-Lite spec is written "
                             "either way)"),
) -> None:
    """Delta-debug the requests in flight around a stall (its victim, its culprits and every request in flight
    before and during it) down to the fewest that still stall the victim by --share of the original gap: first
    on a virtual-time replay of the run's target (its own simulator configuration, or the cost model fitted to
    the run), then confirmed by running the reduced set on the target itself. Writes scenario.yaml + trace.csv
    (loadgen run replays them), repro.py (standard library only, for a bug report), shrink.json and
    figure.png, and adds a "Smallest reproduction" section to RUN/report.html. Exit 0: reproduced (>= 4 of 5
    confirmations); 1: not; 2: bad input, or the target could not be used in any confirmation."""
    if out is not None:  # as run's: never over a folder of the user's, nor an earlier reproduction
        check_out_dir(out)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from loadgen.shrink.event import ShrinkError  # here, not at the top: `loadgen --help` starts without them
    from loadgen.shrink.search import ShrinkOptions, shrink as shrink_run

    opts = ShrinkOptions(stall, request, out, max_tries, timeout_s, confirmations, share, png)
    try:
        with Progress(TextColumn("shrink: {task.description}"), BarColumn(), TextColumn("{task.completed}/"
                      "{task.total} replays"), TimeElapsedColumn(), console=err, transient=True) as bar:
            task = bar.add_task("reading the run", total=max_tries)
            result = shrink_run(run_dir, opts, lambda line, done, total: bar.update(
                task, description=line, completed=done, total=total))
    except ShrinkError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:  # --out (or the run directory) cannot be written
        raise fail(f"{exc.filename or out or run_dir}: cannot write the reproduction: {exc.strerror or exc}") from None
    for line in summary_lines(result) + [report_line(run_dir, result.out, png)]:
        console.print(line, highlight=False)
    conf = result.confirmation
    if conf is not None and conf.target_down:
        raise fail(f"the target could not be used in any of {conf.runs} confirmation runs ({conf.errors[0]}); the "
                   f"reproduction's files are written: confirm with loadgen run {result.out / 'scenario.yaml'}")
    raise typer.Exit(result.exit_code)


def report_line(run_dir: Path, out: Path, png: bool) -> str:
    """report.html rebuilt with its "Smallest reproduction" section (every RUN/shrink-*/), where the
    reproduction went there; a page that cannot be rebuilt is a note, the shrink's files stand."""
    if out.resolve().parent != run_dir.resolve() or not out.name.startswith("shrink-"):
        return f"report.html: not updated (--out {out} is outside the run's shrink-*/ folders)"
    from loadgen.run.reporting import add_shrink_section

    try:
        add_shrink_section(run_dir, png)
    except (OSError, ValueError, RunDirError) as exc:
        return f"report.html: not updated ({exc})"
    return f"report.html: \"Smallest reproduction\" section added ({run_dir / 'report.html'})"


def summary_lines(result: ShrinkResult) -> list[str]:
    from loadgen.shrink.writers import auth_line, prompts_line

    doc, ev = result.doc, result.event
    what = "TTFT" if ev.metric == "ttft_ms" else "gap"
    lines = [f"{ev.label}: request {ev.victim.seq}'s {ev.gap_ms:.0f} ms {what} ({ev.cause or 'no cause'}); "
             f"seed set {doc['seed_set']} requests, {doc['tries']} replays ({doc['stopped']}), "
             f"{doc['wall_s']:.1f} s",
             f"final set: {len(result.items)} requests, victim's {what} on the replay {result.replay_gap_ms:.0f} ms "
             f"({result.replay_gap_ms / ev.gap_ms:.0%} of the original)"]
    for row in doc["final_set"]:
        lines.append(f"  seq {row['seq']} ({row['role']}): +{row['offset_s']:.3f} s, {row['prompt_tokens']} "
                     f"prompt tokens, {row['output_tokens']} output tokens")
    conf = doc["confirmations"]
    if conf is not None:
        gaps = ", ".join(f"{g:.0f}" for g in conf["gaps_ms"])
        lines.append(f"on the target: reproduced in {conf['reproduced']} of {conf['runs']} runs (victim's {what} "
                     f"{gaps} ms; needs {conf['needed']} of {conf['asked']})")
        lines += [f"  a run failed: {e}" for e in conf["errors"]]
    lines.append(prompts_line(result.bodies))
    lines += [line for line in [auth_line(result.scenario) if result.scenario else None] if line]
    verdict = "reproduced" if result.reproduced else "NOT reproduced"
    lines.append(f"{verdict}: {result.out / 'scenario.yaml'}, {result.out / 'repro.py'}, "
                 f"{result.out / 'shrink.json'}")
    return lines
