"""loadgen from Python: the same runs, reports and comparisons as the command line, with typed results.

    from loadgen import api

    scenario = api.load_scenario("smoke", overrides={"load.duration_s": 5})  # a file, or a bundled name
    result = api.run(scenario, out="reports/smoke-api")
    print(result.verdict, result.metrics["ttft_ms"]["p99"], result.stalls["count"])
    again = api.report(result.run_dir)            # recomputed from the raw records
    diff = api.compare(result.run_dir, again.run_dir)
    advice = api.advise(result.run_dir)            # which server setting would meet the SLOs
    many = api.repeat(scenario, 5)                 # 5 runs (seeds seed…seed+4), one combined verdict
    audit = api.check(scenario)                    # can this endpoint be measured honestly?
    sized = api.size(scenario, from_run=result.run_dir)  # how long to run to certify each objective

Errors are loadgen/errors.py's one tree under ``LoadgenError``. Bad input raises an ``InputError`` with the one
line the CLI prints, before anything is sent: ``ScenarioError`` (a scenario, flag or override), ``CompareError``
(run directories that cannot be compared), ``AdviceError`` (one that cannot be advised on), ``SettingsError`` (a
bad ``tries`` or ``server`` item), ``RunDirError`` (an unreadable run directory); an unusable target raises
``TargetError``, a ``ServerFault``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, Literal, Mapping, Sequence, cast

try:  # an interpreter without loadgen's dependencies (a clone's folder on the path, nothing installed): say so
    importlib.import_module("pydantic")
    importlib.import_module("yaml")
except ModuleNotFoundError as exc:
    import sys
    raise ModuleNotFoundError(f"loadgen's dependency {exc.name!r} is missing in this interpreter "
                              f"({sys.executable}): install loadgen into it first (pip install . in a clone, or "
                              "the wheel)", name=exc.name) from None

from loadgen.core.secrets import RedactingStream, register
from loadgen.errors import (AdviceError, CompareError, InputError, LoadgenError, RunDirError, ScenarioError,
                            ServerFault, SettingsError, TargetError)
from loadgen.plan.scenario import Scenario
from loadgen.plan.bundled import resolve_scenario_arg
from loadgen.plan.scenario_file import load_scenario as _load_file

if TYPE_CHECKING:
    from rich.console import Console

    from loadgen.analysis.advice_result import Advice
    from loadgen.analysis.check_result import CheckResult
    from loadgen.analysis.repeat_result import RepeatResult
    from loadgen.analysis.result import RunResult
    from loadgen.analysis.size_result import SizeResult
    from loadgen.analysis.sweep_result import SweepResult
    from loadgen.run.comparison import Comparison
    from loadgen.run.runner import RunOptions

__all__ = ["Advice", "AdviceError", "CheckResult", "CompareError", "Comparison", "InputError", "LoadgenError",
           "RepeatResult", "RunDirError", "RunResult", "Scenario", "ScenarioError", "ServerFault", "SettingsError",
           "SizeResult", "SweepResult", "TargetError", "advise", "check", "compare", "load_scenario", "repeat",
           "report", "run", "size", "sweep", "ui"]

# Result types from the stages that are heavy to import (polars, altair, httpx, the advisor): each is imported
# when first named (PEP 562), so that ``import loadgen.api`` stays light (tests/test_api_surface.py). The errors
# are loadgen/errors.py's one tree, light already.
_LAZY = {"Advice": "loadgen.analysis.advice_result", "CheckResult": "loadgen.analysis.check_result",
         "Comparison": "loadgen.run.comparison", "RepeatResult": "loadgen.analysis.repeat_result",
         "RunResult": "loadgen.analysis.result", "SizeResult": "loadgen.analysis.size_result",
         "SweepResult": "loadgen.analysis.sweep_result"}


if not TYPE_CHECKING:  # the type checker reads the imports above instead, and still flags a misspelt name
    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # once: later lookups find it without coming here
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


Overrides = Sequence[str] | Mapping[str, Any]


def load_scenario(path: str | Path, overrides: Overrides = (), flags: Mapping[str, str] | None = None) -> Scenario:
    """Read, expand (``${VAR:-default}``), override and validate a scenario: a file's path, or the name of a scenario
    shipped in the package (``"smoke"``, ``"long_context"``: ``loadgen scenario list``) where no such file exists
    in the working folder, so a script runs from anywhere. ``overrides``: ``--set`` items
    (``"load.rate_per_s=8"``) or a mapping of dotted fields to values. ScenarioError names the bad field."""
    from loadgen.run.target import scenario_secrets

    items = [f"{k}={json.dumps(v)}" for k, v in overrides.items()] if isinstance(overrides, Mapping) \
        else list(overrides)
    scenario = _load_file(resolve_scenario_arg(Path(path)), items, dict(flags or {}))
    register(*scenario_secrets(scenario))  # its secrets never reach any output from here on
    return scenario


def run(scenario: Scenario | str | Path, *, base_url: str | None = None, out: str | Path | None = None,
        engine: Literal["asyncio", "locust"] = "asyncio", workers: int | Literal["auto"] = 1,
        progress: bool = False, png: bool = False, reports_dir: str | Path = "reports", server_metrics: bool = True,
        server_metrics_period_s: float = 0.5, capture: int = 0, console: Console | None = None) -> RunResult:
    """Run a scenario (a ``Scenario`` or a file's path) and write its run directory (``out``, default
    ``reports_dir/<time>-<name>/``); returns the result (``run_dir`` set). ``base_url`` overrides the target's.
    ``capture``: keep the first N failed responses as received (``captures/``: heads as sent, bodies de-chunked and decoded, redacted).
    ``workers``: sending processes on this machine (N, or ``"auto"``: one per usable core; 0 is 1): one plan
    split between them, one run directory, one verdict (engine locust: N local Locust workers and a master).
    ``console``: where the progress, warnings and summary go (default: nowhere)."""
    from rich.console import Console

    from loadgen.plan.shares import process_count, processes_for
    from loadgen.run.runner import RunOptions, run_scenario

    if engine not in ("asyncio", "locust"):
        raise ScenarioError(f"engine {engine!r}: choose asyncio or locust")
    n = process_count(workers)
    if capture and n > 1:
        raise ScenarioError("capture keeps what one process received: it works with workers=1")
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    source = sc.source
    if engine == "locust" and n > 1 and source is None:
        raise ScenarioError("workers need a scenario loaded from a file (api.load_scenario or a path): each "
                            "worker process loads it again")
    sc = _with_base_url(sc, base_url)
    opts = RunOptions(out=Path(out) if out is not None else None, reports_dir=Path(reports_dir), progress=progress,
                      png=png, server_metrics=server_metrics, server_metrics_period_s=server_metrics_period_s,
                      capture=capture)
    console = console or Console(quiet=True)
    if processes_for(sc, n) < n:  # a process without a user would send nothing
        console.print(f"note: {sc.load.concurrency} user(s) run on {processes_for(sc, n)} process(es), not {n}",
                      highlight=False, markup=False)
        n = processes_for(sc, n)
    if engine == "locust":
        refuse_locust_sessions(sc, "drop --engine locust")
    with _redacted(console):
        if engine == "locust":  # Locust's own meaning: 0 one process, N ≥ 2 N workers and a master
            return _run_locust(sc, opts, console, n if n > 1 else 0, source, base_url)
        if n > 1:
            from loadgen.run.workers import run_workers

            return run_workers(sc, opts, console, n)
        return run_scenario(sc, opts, console)


def repeat(scenario: Scenario | str | Path, n: int, *, base_url: str | None = None, out: str | Path | None = None,
           engine: Literal["asyncio", "locust"] = "asyncio", workers: int | Literal["auto"] = 1,
           progress: bool = False, png: bool = False, reports_dir: str | Path = "reports", server_metrics: bool = True,
           console: Console | None = None) -> RepeatResult:
    """``loadgen run --repeat N``: the scenario ``n`` times (2 ≤ n ≤ 100) with fresh seeds — the scenario's seed,
    seed + 1, …, seed + n − 1 — each a full run in ``out/run-01-seed<S>/`` … (``out`` default
    ``reports_dir/<time>-<name>-repeat/``), combined into ``out``'s repeat.json, summary.md, junit.xml and
    repeat.html: across-run mean, t-interval and CV per metric and one verdict (docs/verdicts.md, "Repeated
    runs"). ``exit_code``: the combined verdict's. ``console``: one line per run and the combined tables."""
    from rich.console import Console

    from loadgen.run.repeat import check_repeat, repeat_dir, run_repeat

    check_repeat(n)
    sc = _with_base_url(scenario if isinstance(scenario, Scenario) else load_scenario(scenario), base_url)
    parent = repeat_dir(sc, Path(out) if out is not None else None, Path(reports_dir))
    console = console or Console(quiet=True)

    def run_one(one: Scenario, run_dir: Path) -> RunResult:
        return run(one, out=run_dir, engine=engine, workers=workers, png=png, base_url=base_url, progress=progress,
                   server_metrics=server_metrics)
    with _redacted(console):
        return run_repeat(sc, n, parent, run_one, console)


@contextlib.contextmanager
def _redacted(console: Console) -> Iterator[None]:
    """While loadgen writes to a caller's console, every write passes the redactor first (the CLI wraps the
    process's stdout and stderr; a Python caller's console gets the same guarantee): its file is wrapped for the
    call and given back after, every other setting (theme, width) its own. Recording (``record=True``) is paused
    for the call: rich records what it renders before the file sees it, so an export would hold the secrets."""
    before, recording = console.file, console.record
    if isinstance(before, RedactingStream):
        yield
        return
    console.file, console.record = cast(IO[str], RedactingStream(before)), False
    try:
        yield
    finally:
        console.file, console.record = before, recording


def _with_confidence(sc: Scenario, confidence: float | None) -> Scenario:
    """The scenario with ``slo.confidence`` set (None: its own): every step's objectives are decided at it."""
    if confidence is None or confidence == sc.slo.confidence:
        return sc
    if sc.source is not None:  # kept as a file and overrides, as the steps are made from it
        path, items = sc.source
        return load_scenario(path, items + [f"slo.confidence={confidence}"])
    return sc.model_copy(update={"slo": sc.slo.model_copy(update={"confidence": confidence})})


def _with_base_url(sc: Scenario, base_url: str | None) -> Scenario:
    """The scenario with its target's base URL replaced (None: as it is), its secrets registered."""
    if base_url is None:
        return sc
    from loadgen.plan.scenario import base_url_checked
    from loadgen.run.target import scenario_secrets

    try:
        base_url = base_url_checked(base_url)  # target.base_url's own rule (the CLI's --base-url is an override)
    except ValueError as exc:
        raise ScenarioError(f"base_url {base_url!r}: {exc}") from None
    sc = sc.model_copy(update={"target": sc.target.model_copy(update={"base_url": base_url})})
    register(*scenario_secrets(sc))
    return sc


def refuse_locust_sessions(sc: Scenario, remedy: str) -> None:
    """Sessions run on the asyncio engine only (drivers/sessions.py): Locust's users would send a session's calls
    as unrelated requests (no transcript, no parents, no tool results, records without the session fields), so
    every Locust entry point — ``run`` with engine locust, ``ui`` and the CLI's ``worker`` — refuses a scenario
    with a session class in one line (exit 2), before Locust is started or anything sent. Not in ``__all__``:
    the command line's worker calls it (it has no API call of its own)."""
    names = [c.name for c in sc.workload.classes if c.session is not None]
    if names:
        which = f"class {names[0]!r} has" if len(names) == 1 else f"classes {', '.join(map(repr, names))} have"
        raise ScenarioError(f"sessions run on the asyncio engine, not Locust ({which} a session): {remedy}")


def _run_locust(sc: Scenario, opts: RunOptions, console: Console, workers: int,
                source: tuple[Path, list[str]] | None, base_url: str | None) -> RunResult:
    from loadgen.run import locust_run  # first: Locust monkey-patches the process when imported

    launch = None
    if workers and source is not None:
        path, items = source
        launch = locust_run.WorkerLaunch(path, items + ([f"target.base_url={json.dumps(base_url)}"]
                                                        if base_url is not None else []))
    return locust_run.LocustRun(sc, opts, console, workers, launch).execute()


def ui(scenario: Scenario | str | Path, *, host: str = "127.0.0.1", port: int = 8089, web_login: bool = False,
       master: bool = False, master_bind: tuple[str, int] = ("*", 5557), reports_dir: str | Path = "reports",
       png: bool = True, console: Console | None = None) -> None:
    """Locust's web UI with the scenario loaded and the LLM tab, until Ctrl-C (``loadgen ui``): each Start is
    one run, written like ``run``'s. Ctrl-C or SIGTERM writes the run in progress, then raises SystemExit(3), as
    an interrupted ``run`` exits 3. Raises TargetError before serving when the target is unusable, and
    ScenarioError for a scenario with a session class (sessions run on the asyncio engine: ``run``)."""
    remedy = "loadgen ui is Locust's web UI; run it with loadgen run"
    if isinstance(scenario, Scenario):
        refuse_locust_sessions(scenario, remedy)  # before Locust is even imported
    from loadgen.run import locust_ui  # first: Locust monkey-patches the process when imported
    from rich.console import Console

    from loadgen.run.runner import RunOptions

    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    refuse_locust_sessions(sc, remedy)
    opts = RunOptions(reports_dir=Path(reports_dir), progress=False, png=png)
    console = console or Console()
    session = locust_ui.UiSession(sc, opts, console, host, port, web_login, master, master_bind)
    with _redacted(console):
        session.serve()


def report(run_dir: str | Path, *, window: tuple[float, float] | None = None, png: bool = True) -> RunResult:
    """Recompute the summary, verdict and every report file of a run directory from its raw records."""
    from loadgen.run.runner import rebuild_reports

    run_dir = Path(run_dir)
    if not (run_dir / "run.json").exists():
        raise ScenarioError(f"{run_dir}: no run.json (is this a loadgen run directory?)")
    return rebuild_reports(run_dir, window=window, png=png, again=True)


def compare(base: str | Path, new: str | Path, *, metrics: Sequence[str] | None = None, threshold_pct: float = 10.0,
            error_rate_pp: float | None = None, stall_rate_delta: float | None = None, confidence: float = 0.95,
            replicates: int = 1000, seed: int = 0, out: str | Path | None = None) -> Comparison:
    """NEW against BASE: the verdict change first (``doc["verdict_change"]``), then per metric with bootstrap
    confidence intervals. ``error_rate_pp`` / ``stall_rate_delta``: None derives them from the scenarios' limits
    (half of each; docs/verdicts.md "compare"). Either side may be a repeat's directory (its runs pooled).
    ``exit_code``: 1 when a metric regressed or the verdict got worse. ``out`` (if given) receives compare.json,
    compare.md, compare.html and compare-junit.xml."""
    from loadgen.report.compare_report import write_comparison
    from loadgen.run.comparison import CompareOptions, Comparison, compare_runs

    opts = CompareOptions(threshold_pct=threshold_pct, error_rate_pp=error_rate_pp,
                          stall_rate_delta=stall_rate_delta, confidence=confidence, replicates=replicates, seed=seed)
    if metrics:
        opts.metrics = tuple(metrics)
    doc, results = compare_runs(Path(base), Path(new), opts)
    comparison = Comparison(doc, results)
    if out is not None:
        write_comparison(Path(out), doc, results)
    return comparison


def sweep(scenario: Scenario | str | Path, *, rates: Sequence[float] | None = None,
          concurrency: Sequence[int] | None = None, find_max: Literal["rate", "concurrency"] | None = None,
          require: float | None = None, tolerance: float = 0.05, budget_s: float = 3600.0, max_steps: int = 20,
          start: float | None = None, step_duration_s: float | None = None,
          until: Literal["time", "decided"] = "time", max_step_duration_s: float | None = None,
          min_step_duration_s: float | None = None, confidence: float | None = None, base_url: str | None = None,
          out: str | Path | None = None, engine: Literal["asyncio", "locust"] = "asyncio",
          workers: int | Literal["auto"] = 1,
          png: bool = False, progress: bool = False, reports_dir: str | Path = "reports",
          console: Console | None = None) -> SweepResult:
    """The scenario at several loads (``loadgen sweep``): fixed ``rates`` or ``concurrency`` steps, or a search
    (``find_max``) for the highest load meeting every SLO with confidence. Each step is a full run under
    ``out/steps/``; sweep.json, summary.md, junit.xml and sweep.html go to ``out``. ``exit_code``: 0 capacity
    meets ``require`` (or, without one, was bracketed), 1 below it, 3 undecided. Fixed steps run
    ``step_duration_s`` exactly; ``until="decided"`` runs an undecided step again, longer, up to
    ``max_step_duration_s`` (default 8× the step); a search sizes its steps between ``min_step_duration_s`` and
    that maximum. ``console``: where each step's line and the capacity go (default: nowhere); ``progress``: a
    progress bar per step on stderr."""
    from rich.console import Console

    from loadgen.plan.shares import process_count
    from loadgen.run.sweep import SweepOptions, run_sweep, sweep_dir

    if sum(x is not None for x in (rates, concurrency, find_max)) != 1:
        raise ScenarioError("give one of rates, concurrency or find_max")
    if find_max not in (None, "rate", "concurrency"):
        raise ScenarioError(f"find_max {find_max!r}: choose rate or concurrency")
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    sc = _with_base_url(_with_confidence(sc, confidence), base_url)
    mode = find_max or ("rate" if rates is not None else "concurrency")
    loads = [float(x) for x in rates] if rates is not None else \
        [float(x) for x in concurrency] if concurrency is not None else None
    opts = SweepOptions(mode, loads, require, tolerance, budget_s, max_steps, start, step_duration_s, until,
                        max_step_duration_s, min_step_duration_s, confidence=sc.slo.confidence, engine=engine,
                        workers=process_count(workers), png=png)
    console = console or Console(quiet=True)

    def run_step(step: Scenario, run_dir: Path) -> RunResult:
        return run(step, out=run_dir, engine=engine, workers=workers, png=png, base_url=base_url, progress=progress)
    with _redacted(console):
        return run_sweep(sc, opts, sweep_dir(sc, Path(out) if out else None, Path(reports_dir)), run_step, console)


def advise(run_dir: str | Path, *, tries: Sequence[str] = (), server: Sequence[str] = (), capacity: bool = False,
           png: bool = True, progress: Callable[[str], None] | None = None, seeds: int = 20,
           margin_pct: float = 10.0) -> Advice:
    """What to change on the server (``loadgen advise``): fit the simulator's cost model to the run, replay the
    run's plan under the current setting (how well the model fits) and under each candidate (``tries``:
    ``KEY=V1,V2`` items; default chunked prefill off and on with budgets 256…8192), each under ``seeds``
    step-noise seeds, and recommend the one that keeps ``margin_pct`` % of every objective's limit (the stall
    threshold lowered by it too) in 95 % of its replays with the most goodput (none: ``closest``).
    ``server``: ``KEY=VALUE`` items saying what the server ran with (read from run.json for the embedded
    simulator). ``capacity``: also each candidate's highest request rate meeting every objective on the
    calibrated simulator (open-loop runs), which then ranks them. Writes advice.json and advice.md, and the
    advice section of report.html. ``exit_code``: 0 a setting keeps the margin, 1 none does."""
    from loadgen.advise.settings import parse_items
    from loadgen.advise.whatif import AdviseOptions
    from loadgen.run.advise import advise_run

    opts = AdviseOptions(parse_items(list(tries), many=True),
                         {k: v[0] for k, v in parse_items(list(server), many=False).items()}, capacity, seeds,
                         margin_pct / 100)
    return advise_run(Path(run_dir), opts, progress or (lambda line: None), png)


def check(scenario: Scenario | str | Path, *, base_url: str | None = None) -> CheckResult:
    """Audit whether the scenario's target can be measured honestly (``loadgen check``; docs/check.md): the
    preflight, then a few probes, one ``Finding`` per line. ``exit_code``: 0 clean, 1 a finding limits what can
    be measured, 2 a line cannot be measured. Raises TargetError when the target is unreachable or not
    OpenAI-compatible (the CLI's exit 2)."""
    from loadgen.run.check import run_check

    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    return run_check(_with_base_url(sc, base_url))


def size(scenario: Scenario | str | Path | None = None, *, from_run: str | Path | None = None,
         confidence: float = 0.95, power: float = 0.8, regression_pct: float = 10.0,
         compare_threshold_pct: float = 0.0, pilot_s: float = 20.0, assurance: float = 0.8,
         base_url: str | None = None,
         reports_dir: str | Path = "reports", console: Console | None = None) -> SizeResult:
    """``loadgen size``: per objective, the samples, requests and seconds a run needs to certify it at
    ``confidence`` with ``power``, and the requests per run for compare to detect a ``regression_pct`` change
    (beyond ``compare_threshold_pct``); then the load.duration_s and load.requests to set (docs/verdicts.md,
    Sizing a run). The pilot: ``from_run`` (a run directory; judged by ``scenario``'s objectives when given),
    else a run of ``scenario`` for ``pilot_s`` measured seconds on its target (under ``reports_dir``).
    ``assurance``: the pilot's estimates are taken at their one-sided bound at this level (0.5: as measured)."""
    from rich.console import Console

    from loadgen.analysis.size_result import SizeOptions
    from loadgen.run.size import size as size_pilot

    sc = None if scenario is None else scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    opts = SizeOptions(confidence, power, regression_pct, compare_threshold_pct, assurance)
    out = console or Console(quiet=True)

    def run_pilot(pilot: Scenario) -> Path:
        out.print(f"pilot: {pilot_s:g} s of {pilot.name} on its target", highlight=False)
        result = run(pilot, base_url=base_url, reports_dir=reports_dir, console=Console(quiet=True))
        out.print(f"pilot run: {result.run_dir} ({result.verdict.upper()})", highlight=False)
        assert result.run_dir is not None
        return Path(result.run_dir)
    return size_pilot(sc, None if from_run is None else Path(from_run), opts, pilot_s, run_pilot)
