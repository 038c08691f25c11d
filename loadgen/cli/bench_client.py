"""``loadgen bench-client``: a capacity self-test of the client on the user's own machine (run/bench_client.py):
how many tokens/s loadgen measures with both per-event p99 errors within a tolerance, before a real run."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from loadgen.cli.common import Parser, console, err, fail, seconds_option, workers_flag, workers_option
from loadgen.cli.vocabulary import FlagError
from loadgen.run import bench_client as bc

def _streams(flag: str) -> Parser:
    """A whole number of streams: a bad one is one line, exit 2 (not click's usage box)."""
    def parse(text: str) -> int:
        try:
            return int(str(text).strip())
        except ValueError:
            raise FlagError(f"{flag} {text!r}: give a whole number of streams, e.g. {flag} 64") from None
    return Parser("count", flag, parse)


MAX_ERROR = seconds_option("1ms", "--max-error", "the tolerance: a step holds when its chunk-gap and TTFT p99 "
                           "errors are both within it, e.g. 1ms, 0.5ms")
STEP_DURATION = seconds_option("10s", "--step-duration", "measured time of each step, after its 2 s warm-up, "
                               "e.g. 10s, 1m")
WORKERS = workers_option("sending processes measured together, as in run: N, or auto (one per core beside the "
                         "emitter's); default 1. Each step's streams are split between them")


def bench_client(
    max_streams: int = typer.Option(512, "--max-streams", metavar="N", parser=_streams("--max-streams"), help=f"the last step's streams (at most "
                                    f"{bc.MAX_STREAMS}: each holds a connection)"),
    start: int = typer.Option(32, "--start", metavar="N", parser=_streams("--start"), help="the first step's streams; then doubling up to 128, then 64 "
                              "more each step, up to --max-streams"),
    step_duration: float = STEP_DURATION,
    max_error: float = MAX_ERROR,
    engine: str = typer.Option("asyncio", "--engine", help="the engine measured: asyncio or locust, as in run"),
    workers_: str = WORKERS,
    out: Optional[Path] = typer.Option(None, "--out", help="also write every step and the result to this JSON "
                                       "file"),
) -> None:
    """How many tokens/s loadgen measures within --max-error on this machine: steps up the streams of a closed
    loop against a precise local SSE emitter (its writes' true times logged), loadgen's own engine as a run
    uses it, and prints per step tokens/s, the chunk-gap and TTFT p99 errors against the emitter's writes,
    loadgen's CPU per 1k tokens and the emitter's lateness. Stops after the first step past the tolerance; the
    last line says the highest load that held. With 2+ CPUs the emitter and loadgen are pinned to different
    ones. Ends within steps x (--step-duration + 62 s): each step a 2 s warm-up, its duration and at most 60 s
    for starting, draining, reporting and scoring. Exit 0: a step held; 1: none did; 2: bad flags; 3:
    interrupted, or a step could not be measured; 4: a bug in loadgen (a step's run exited 4)."""
    workers = _check_flags(max_streams, start, max_error, engine, workers_, out)
    settings = bc.Settings(bc.ladder(start, max_streams), step_duration, max_error * 1e3, engine, workers)
    pin = bc.plan_pinning(sorted(os.sched_getaffinity(0)), workers + (engine == "locust" and workers > 1))
    load_1m = os.getloadavg()[0]
    _header(settings, pin, load_1m)
    rows: list[dict[str, Any]] = []
    # Ctrl-C and `kill PID` both stop it in order (SIGINT explicitly: a shell's background job inherits it ignored)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        rows = bc.bench(settings, pin, lambda i, n: _progress(settings, i, n), lambda r: _row(r, rows))
        code = 0 if bc.best(rows) is not None else 1
    except bc.StepError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
        code = 4 if exc.bug else 3  # exit 4 is loadgen's bug only (docs/exit-codes.md)
    except KeyboardInterrupt:
        err.print("interrupted", highlight=False, markup=False)
        code = 3
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _finish(settings, pin, rows, out, load_1m)
    raise typer.Exit(code)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _check_flags(max_streams: int, start: int, max_error_s: float, engine: str, workers: str,
                 out: Optional[Path]) -> int:
    """Every flag before anything starts: one line, exit 2; the number of sending processes."""
    if not sys.platform.startswith("linux"):
        raise fail("bench-client needs Linux: its emitter uses epoll and CPU affinity")
    if not 1 <= start <= bc.MAX_STREAMS:
        raise fail(f"--start {start}: give a number of streams from 1 to {bc.MAX_STREAMS}")
    if not start <= max_streams <= bc.MAX_STREAMS:
        raise fail(f"--max-streams {max_streams}: give a number of streams from --start ({start}) to "
                   f"{bc.MAX_STREAMS}")
    if not (math.isfinite(max_error_s) and max_error_s <= 1.0):
        raise fail(f"--max-error {max_error_s:g}s: a tolerance of a second or more tests nothing; give e.g. 1ms")
    if engine not in ("asyncio", "locust"):
        raise fail(f"--engine {engine!r}: choose asyncio or locust")
    if out is not None:
        _check_out(out)
    if str(workers).strip() == "auto":  # one per core, the emitter's left to it
        return max(1, len(os.sched_getaffinity(0)) - 1)
    return workers_flag(workers)


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise fail(f"--out {out}: a directory; give a file name, e.g. bench-client.json")
    try:  # a real write, now: a bad path must not wait for the end of a long test
        out.parent.mkdir(parents=True, exist_ok=True)
        existed = out.exists()
        with out.open("a"):
            pass
        if not existed:
            out.unlink()
    except OSError as exc:
        raise fail(f"--out {out}: cannot write there: {exc.strerror or exc}") from None


def _say(line: str, stderr: bool = False) -> None:
    (err if stderr else console).print(line, highlight=False, markup=False, soft_wrap=True)


def _header(settings: bc.Settings, pin: bc.Pinning, load_1m: float) -> None:
    steps = settings.steps
    bound = bc.bound_s(len(steps), settings.duration_s)
    plural = "s" if len(steps) > 1 else ""
    _say(f"loadgen bench-client: {len(steps)} step{plural} of {', '.join(map(str, steps))} streams, each "
         f"{bc.WARMUP_S:g} s of warm-up (left out) + {settings.duration_s:g} s; {bc.OUTPUT_TOKENS}-token streams, "
         f"one token every {bc.ITL_MS:g} ms; ends within {bound / 60:.1f} min")
    _say(bc.machine_line(len(os.sched_getaffinity(0)), load_1m))
    _say(f"pinning: {pin.describe()}")
    _say(f"| streams | tokens/s | chunk-gap p99 error | TTFT p99 error | CPU per 1k tokens | emitter lateness p99 "
         f"| within {settings.max_error_ms:g} ms |\n| ---: | ---: | ---: | ---: | ---: | ---: | --- |")


def _progress(settings: bc.Settings, i: int, streams: int) -> None:
    _say(f"step {i + 1}/{len(settings.steps)}: {streams} streams for {bc.WARMUP_S:g} s + {settings.duration_s:g} s "
         "…", stderr=True)


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f} ms"


def _row(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    rows.append(row)
    cpu = "-" if math.isnan(row["cpu_ms_per_1k"]) else f"{row['cpu_ms_per_1k']:.1f} ms"
    failed = f" ({row['failed']} failed)" if row["failed"] else ""
    _say(f"| {row['streams']} | {row['tokens_per_s']:,.0f} | {_ms(row['gap_p99_ms'])} | {_ms(row['ttft_p99_ms'])} "
         f"| {cpu} | {row['emitter_lateness_p99_us']:.0f} µs | {'yes' if row['held'] else 'no'}{failed} |")


def _finish(settings: bc.Settings, pin: bc.Pinning, rows: list[dict[str, Any]], out: Optional[Path],
            load_1m: float) -> None:
    if rows:
        _say(f"emitter: {rows[0]['emitter_scheduler']}; its lateness is not in the errors (the truth is its "
             "writes), but a large one means it did not keep the load asked")
    if rows and all(r["held"] for r in rows) and rows[-1]["streams"] == settings.steps[-1]:
        _say("every step held: raise --max-streams to find the limit")
    line = bc.final_line(rows, settings.max_error_ms, settings.workers)
    if out is not None:
        out.write_text(json.dumps(bc.document(settings, pin, rows, line, load_1m), indent=1) + "\n")
    _say(line)
