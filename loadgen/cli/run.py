"""``loadgen run``: a scenario file (or a bundled scenario by name), or a quick start from flags alone
(plan/quick.py), against a target; writes the run directory and prints the verdict. Exit codes (run/exits.py):
0 pass, 1 SLO failed, 2 usage/config error (nothing sent), 3 inconclusive or interrupted, 4 internal error."""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Optional

import typer

from loadgen import api
from loadgen.cli import vocabulary
from loadgen.cli.common import FLAGS, Parser, check_out_dir, console, err, fail, percent_option, \
    scenario_overrides, seconds_option, workers_flag, workers_option
from loadgen.plan import bundled, quick
from loadgen.plan.scenario import ScenarioError

NO_ARGUMENT = """\
loadgen run needs a target or a scenario. A quick start, no file needed:
  loadgen run --base-url http://host:8000/v1 --model M --rate 4 --duration 20
  loadgen run --base-url embedded --rate 4      (the bundled simulator)
Or a scenario: loadgen scenario list shows the bundled ones, then
  loadgen run long_context                      (a bundled one, by name)
  loadgen run my_scenario.yaml                  (a file; run -h: all flags)"""


def _one(kind: str, flag: str, plural: str) -> Parser:
    """A single number; a comma-separated list is a sweep's (exit 2 with the command that takes one)."""
    def parse(text: str) -> float:
        values = vocabulary.numbers(str(text), flag)
        if len(values) > 1:
            raise vocabulary.FlagError(f"{flag} {text}: a list of {plural} is a sweep: loadgen sweep {flag} {text}")
        if kind == "count" and values[0] != int(values[0]):
            raise vocabulary.FlagError(f"{flag} {text}: give a whole number of users")
        return values[0]
    return Parser("list", flag, parse)


# the options, one per line of run's signature below
SCENARIO = typer.Argument(None, help="scenario file (YAML), or a bundled scenario's name (loadgen scenario list); "
                          "none: the quick start from the flags")
BASE_URL = typer.Option(None, "--base-url", help="OpenAI-compatible base URL (…/v1; without /v1 it is tried too); "
                        "default: the scenario's, 'embedded' starts the bundled simulator")
MODEL = typer.Option(None, "--model", help="model name ('auto' = first of /v1/models)")
API_KEY_ENV = typer.Option(None, "--api-key-env", help="environment variable with the API key")
RATE = typer.Option(None, "--rate", metavar="REQ/S", parser=_one("number", "--rate", "rates"),
                    help="requests per second, Poisson arrivals (quick start: 1)")
CONCURRENCY = typer.Option(None, "--concurrency", metavar="N", parser=_one("count", "--concurrency", "concurrencies"),
                           help="closed loop: N users, each sending its next request when the last one ends")
PROMPT_TOKENS = typer.Option(None, "--prompt-tokens", "--input-len", min=1,
                             help="prompt tokens per request (quick start: 512)")
OUTPUT_TOKENS = typer.Option(None, "--output-tokens", "--output-len", min=1,
                             help="output tokens per request (quick start: 128)")
SPREAD = percent_option(None, "--spread", "token counts drawn uniformly within ±this share of --prompt-tokens/"
                        "--output-tokens (vllm bench's --random-range-ratio), e.g. 10%")
DATASET = typer.Option(None, "--dataset", help="prompts from a file (jsonl, csv, parquet, ShareGPT .json), or "
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
REPEAT = typer.Option(1, "--repeat", min=1, help="N runs (2-100), seeds seed…seed+N-1, in OUT/run-NN-seedS/, and "
                      "one combined verdict and report (repeat.json, repeat.html; docs/verdicts.md)")


def run(
    scenario: Optional[Path] = SCENARIO, base_url: Optional[str] = BASE_URL, model: Optional[str] = MODEL,
    api_key_env: Optional[str] = API_KEY_ENV, rate: Optional[float] = RATE, concurrency: Optional[float] = CONCURRENCY,
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
    if scenario is None and base_url is None:
        err.print(NO_ARGUMENT, highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2)
    workers = _check_flags(engine, workers_, capture, server_metrics_period, api_, out)
    q = quick.QuickLoad(rate, None if concurrency is None else int(concurrency), prompt_tokens, output_tokens,
                        spread, None if dataset is None else bundled.dataset_path(dataset), tuple(slo), api_)
    try:
        sets = scenario_overrides(set_, base_url, model, api_key_env, seconds={
            "load.duration_s": duration, "target.request_timeout_s": request_timeout,
            "load.drain_timeout_s": drain_timeout}) + ([] if fail_fast else ["load.fail_fast_requests=0"])
        sc = _scenario(scenario, q, sets)
        if repeat > 1:
            raise typer.Exit(_repeat(sc, repeat, out, engine, workers, progress, png, server_metrics))
        result = api.run(sc, out=out, engine=engine, workers=workers, progress=progress,  # type: ignore
                         png=png, server_metrics=server_metrics,
                         server_metrics_period_s=server_metrics_period, capture=capture, console=console)
    except (ScenarioError, api.TargetError, quick.QuickError) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(result.exit_code)


def _check_flags(engine: str, workers_: str, capture: int, server_metrics_period: float, api_: Optional[str],
                 out: Optional[Path]) -> int:
    """The flags' combinations, before anything is loaded or sent (exit 2); the number of sending processes."""
    if engine not in ("asyncio", "locust"):
        raise fail(f"--engine {engine!r}: choose asyncio or locust")
    workers = workers_flag(workers_, capture)
    if server_metrics_period < 0.05:
        raise fail(f"--server-metrics-period {server_metrics_period:g}s: give 50ms or more")
    if api_ is not None and api_ not in ("chat", "completions"):
        raise fail(f"--api {api_!r}: choose chat or completions")
    if out is not None:
        check_out_dir(out)
    if engine == "locust":  # first: Locust monkey-patches the process when imported
        importlib.import_module("loadgen.run.locust_run")
    return workers


def _load(path: Path, items: list[str], q: quick.QuickLoad) -> api.Scenario:
    """The scenario; an error in a field a flag set names the flag (``--slo ttft_ms.p9=1``), not the field."""
    return api.load_scenario(path, items, {**FLAGS, **quick.FLAGS, **quick.slo_flags(q)})


def _scenario(arg: Optional[Path], q: quick.QuickLoad, sets: list[str]) -> api.Scenario:
    """The quick start's scenario (``arg`` None), or the file's (a bundled one by name) with the quick flags
    as overrides of its single class and its load; ``sets`` (--set and the dedicated flags) apply last."""
    if arg is None:
        with tempfile.TemporaryDirectory(prefix="loadgen-quick-") as tmp:
            path = Path(tmp) / "quick-start-scenario.yaml"
            path.write_text(quick.QUICK_YAML)
            sc = _load(path, quick.overrides(q) + sets, q)
        if not q.slo:
            console.print(quick.DEFAULT_SLO_LINE, highlight=False, markup=False)
        return sc
    path = bundled.resolve_scenario_arg(arg)
    if path != arg:
        console.print(f"note: {arg} is the bundled scenario {path.stem} (loadgen scenario copy {path.stem}: a copy "
                      "to edit)", highlight=False, markup=False)
    sc = _load(path, sets, q)
    if not q.given() and q.api is None:
        return sc
    return _load(path, quick.overrides(q, len(sc.workload.classes), quick=False) + sets, q)


def _repeat(sc: api.Scenario, n: int, out: Optional[Path], engine: str, workers: int, progress: bool,
            png: bool, server_metrics: bool) -> int:
    """run --repeat N: N runs and their combined verdict's exit code."""
    many = api.repeat(sc, n, out=out, engine=engine, workers=workers, progress=progress,  # type: ignore
                      png=png, server_metrics=server_metrics, console=console)
    return many.exit_code
