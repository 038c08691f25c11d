"""``loadgen run``: a scenario file (or a bundled scenario by name), or a quick start from flags alone
(plan/quick.py), against a target; writes the run directory and prints the verdict. Exit codes (run/exits.py):
0 pass, 1 SLO failed, 2 usage/config error (nothing sent), 3 inconclusive or interrupted, 4 internal error."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from loadgen.cli import quickstart
from loadgen.cli.common import check_out_dir, console, err, fail, seconds_option, workers_flag, workers_option
from loadgen.cli.quickstart import Given, Loads, command_line
from loadgen.plan import quick
from loadgen.errors import ScenarioError

if TYPE_CHECKING:
    from loadgen import api

NO_ARGUMENT = """\
loadgen run needs a target or a scenario. A quick start, no file needed:
  loadgen run --base-url http://host:8000/v1 --model M --rate 4 --duration 20
  loadgen run --base-url embedded --rate 4      (the bundled simulator)
Or a scenario: loadgen scenario list shows the bundled ones, then
  loadgen run long_context                      (a bundled one, by name)
  loadgen run my_scenario.yaml                  (a file; run -h: all flags)"""


# the options, one per line of run's signature below
SCENARIO = typer.Argument(None, help="scenario file (YAML), or a bundled scenario's name (loadgen scenario list); "
                          "none: the quick start from the flags")
BASE_URL = quickstart.base_url_option("OpenAI-compatible base URL (…/v1; without /v1 it is tried too); default: "
                                      "the scenario's, 'embedded' starts the bundled simulator")
MODEL, API_KEY_ENV = quickstart.MODEL, quickstart.API_KEY_ENV
RATE = typer.Option(None, "--rate", metavar="REQ/S", parser=quickstart.loads("--rate", "number"),
                    help="requests per second, Poisson arrivals (quick start: 1; a list is a sweep's)")
CONCURRENCY = typer.Option(None, "--concurrency", metavar="N", parser=quickstart.loads("--concurrency", "count"),
                           help="closed loop: N users, each sending its next request when the last one ends")
PROMPT_TOKENS, OUTPUT_TOKENS, SPREAD = quickstart.PROMPT_TOKENS, quickstart.OUTPUT_TOKENS, quickstart.SPREAD
DATASET, SLO, API = quickstart.DATASET, quickstart.SLO, quickstart.API
OUT = typer.Option(None, "--out", help="write the run here (default reports/<time>-<name>)")
DURATION = quickstart.duration_option("measured time, e.g. 20, 90s, 2m (load.duration_s; quick start: 30s)")
REQUEST_TIMEOUT, DRAIN_TIMEOUT = quickstart.REQUEST_TIMEOUT, quickstart.DRAIN_TIMEOUT
SET = typer.Option(None, "--dataset", help="prompts from a file (jsonl, csv, parquet, ShareGPT .json), or "
                       "sharegpt-sample (shipped)")
SLO = typer.Option([], "--slo", metavar="METRIC.STAT=LIMIT", help="an objective, e.g. ttft_ms.p99=2000 or "
                   "error_rate.max=1% (repeatable; quick start: no failed request)")
API = typer.Option(None, "--api", help="chat or completions (quick start: chat)")
OUT = typer.Option(None, "--out", help="write the run here (default reports/<time>-<name>)")
DURATION = seconds_option(None, "--duration", "measured time, e.g. 20, 90s, 2m (load.duration_s; quick start: 30s)")
REQUEST_TIMEOUT = seconds_option(None, "--request-timeout", "from send to a request's last byte, at most "
                                 "(target.request_timeout_s, default 600s)")
DRAIN_TIMEOUT = seconds_option(None, "--drain-timeout", "time in-flight requests get after the last send "
                               "(load.drain_timeout_s, default 30s)", zero_ok=True)
SET = typer.Option([], "--set", help="override any field: --set load.rate_per_s=8 (repeatable)")
PROGRESS = typer.Option(True, "--progress/--no-progress", help="the live progress bar")
PNG = typer.Option(True, "--png/--no-png", help="the PNG copies of the charts (charts/*.png, linked from "
                   "summary.md); report.html is written either way")
SERVER_METRICS = typer.Option(True, "--server-metrics/--no-server-metrics", help="scrape the target's /metrics "
                              "every --server-metrics-period into server_metrics.parquet")
SERVER_METRICS_PERIOD = seconds_option(0.5, "--server-metrics-period", "time between two scrapes of /metrics (at "
                                       "least 50ms)")
ENGINE = typer.Option("asyncio", "--engine", help="asyncio (default) or locust (Locust users in front of the same "
                      "streaming engine; with --workers, Locust's master/worker mode)")
WORKERS = workers_option()
CAPTURE = typer.Option(0, "--capture", min=0, max=1000, help="keep the first N failed responses as received "
                       "(headers as sent, body de-chunked and decoded, redacted) in the run directory's captures/")
FAIL_FAST = typer.Option(True, "--fail-fast/--no-fail-fast", help="stop when the first requests all fail "
                         "(load.fail_fast_requests, 10); --no-fail-fast: run the whole plan")
REPEAT = typer.Option(1, "--repeat", min=1, max=100, help="runs of the scenario: 1, one run; N > 1, N runs "
                      "(seeds seed…seed+N-1, in OUT/run-NN-seedS/) and one combined verdict and report (repeat.json, "
                      "repeat.html; docs/verdicts.md)")  # max: run/repeat.py MAX_REPEAT (tests/test_cli_startup.py)


def run(
    scenario: Optional[Path] = SCENARIO, base_url: Optional[str] = BASE_URL, model: Optional[str] = MODEL,
    api_key_env: Optional[str] = API_KEY_ENV, rate: Optional[Loads] = RATE, concurrency: Optional[Loads] = CONCURRENCY,
    prompt_tokens: Optional[int] = PROMPT_TOKENS, output_tokens: Optional[int] = OUTPUT_TOKENS,
    spread: Optional[float] = SPREAD, dataset: Optional[Path] = DATASET, slo: list[str] = SLO,
    api_: Optional[str] = API, out: Optional[Path] = OUT, duration: Optional[float] = DURATION,
    request_timeout: Optional[float] = REQUEST_TIMEOUT, drain_timeout: Optional[float] = DRAIN_TIMEOUT,
    set_: list[str] = SET, progress: bool = PROGRESS, png: bool = PNG, server_metrics: bool = SERVER_METRICS,
    server_metrics_period: float = SERVER_METRICS_PERIOD, engine: str = ENGINE, workers_: str = WORKERS,
    capture: int = CAPTURE, fail_fast: bool = FAIL_FAST, repeat: int = REPEAT,
) -> None:
    """Run a scenario (a file, a bundled one by name, or a quick start from --base-url and the load flags), write
    the run directory and print the verdict (--repeat N: N runs, one verdict)."""
    from loadgen import api  # here, not at the top: `loadgen --help` starts without it (cli/app.py)

    if scenario is None and base_url is None:
        err.print(NO_ARGUMENT, highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2)
    given = Given(base_url, model, api_key_env, prompt_tokens, output_tokens, spread, dataset, slo, api_, duration,
                  request_timeout, drain_timeout, set_)
    workers = _check_flags(engine, workers_, capture, server_metrics_period, given, out)
    _one_load(scenario, rate, concurrency, [*given.args(), *_carried(out, engine, workers_, png, progress)])
    q = given.load(rate[0] if rate else None, int(concurrency[0]) if concurrency else None)
    try:
        sets = given.overrides() + ([] if fail_fast else ["load.fail_fast_requests=0"])
        sc = quickstart.scenario(scenario, q, sets)
        if repeat > 1:
            raise typer.Exit(_repeat(sc, repeat, out, engine, workers, progress, png, server_metrics))
        result = api.run(sc, out=out, engine=engine, workers=workers, progress=progress,  # type: ignore
                         png=png, server_metrics=server_metrics,
                         server_metrics_period_s=server_metrics_period, capture=capture, console=console)
    except (ScenarioError, api.TargetError, quick.QuickError) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(result.exit_code)


def _one_load(scenario: Optional[Path], rate: Optional[Loads], concurrency: Optional[Loads], words: list[str]) -> None:
    """A run runs one load; a list of them is a sweep: exit 2 with the sweep's command line, the user's other
    flags carried over, so that it runs as printed."""
    flag, values, plural = ("--rate", rate, "rates") if rate and len(rate) > 1 else \
        ("--concurrency", concurrency, "concurrencies") if concurrency and len(concurrency) > 1 else ("", None, "")
    if values is None:
        return
    steps = ",".join(f"{v:g}" for v in values)
    head = [] if scenario is None else [str(scenario)]
    raise fail(f"{flag} {steps}: a list of {plural} is a sweep: {command_line('sweep', *head, flag, steps, *words)}")


def _carried(out: Optional[Path], engine: str, workers_: str, png: bool, progress: bool) -> list[str]:
    """run's flags that sweep takes too, as given (for the sweep's command line run suggests)."""
    return [*([] if out is None else ["--out", str(out)]), *([] if engine == "asyncio" else ["--engine", engine]),
            *([] if str(workers_).strip() == "1" else ["--workers", workers_]), *([] if png else ["--no-png"]),
            *([] if progress else ["--no-progress"])]


def _check_flags(engine: str, workers_: str, capture: int, server_metrics_period: float, given: Given,
                 out: Optional[Path]) -> int:
    """The flags' combinations, before anything is loaded or sent (exit 2); the number of sending processes."""
    if engine not in ("asyncio", "locust"):
        raise fail(f"--engine {engine!r}: choose asyncio or locust")
    workers = workers_flag(workers_, capture)
    if server_metrics_period < 0.05:
        raise fail(f"--server-metrics-period {server_metrics_period:g}s: give 50ms or more")
    given.check()
    if out is not None:
        check_out_dir(out)
    if engine == "locust":  # first: Locust monkey-patches the process when imported
        importlib.import_module("loadgen.run.locust_run")
    return workers


def _repeat(sc: api.Scenario, n: int, out: Optional[Path], engine: str, workers: int, progress: bool,
            png: bool, server_metrics: bool) -> int:
    """run --repeat N: N runs and their combined verdict's exit code."""
    from loadgen import api

    many = api.repeat(sc, n, out=out, engine=engine, workers=workers, progress=progress,  # type: ignore
                      png=png, server_metrics=server_metrics, console=console)
    return many.exit_code
