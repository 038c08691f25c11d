"""``loadgen size``: a pilot (a run directory given with --from, or a short run of the scenario now) sized by
analysis/size_result.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.size_result import SizeOptions, SizeResult, size_run
from loadgen.analysis.summary import summarize
from loadgen.errors import InputError, RunDirError
from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.run.reporting import read_run_info, scan_whole_records, stored_summary

PILOT_S = 20.0  # the default pilot: this many measured seconds at the scenario's own load


def check_options(opts: SizeOptions, pilot_s: float) -> None:
    """InputError (exit 2) for options out of range, before any pilot is run."""
    if not 0.5 <= opts.confidence < 1:
        raise InputError(f"--confidence {opts.confidence:.0%}: give a level from 50% to below 100%, e.g. 95%")
    if not 0.5 <= opts.power < 1:
        raise InputError(f"--power {opts.power:.0%}: give a power from 50% to below 100%, e.g. 80%")
    if opts.regression_pct <= opts.compare_threshold_pct or opts.regression_pct <= 0:
        raise InputError(f"--regression {opts.regression_pct:g}%: must be above 0 and above compare's threshold "
                         f"({opts.compare_threshold_pct:g}%)")
    if not 0.5 <= opts.assurance < 1:
        raise InputError(f"--pilot-assurance {opts.assurance:.0%}: give a level from 50% to below 100% (50%: the pilot's "
                         "estimates as measured)")
    if pilot_s <= 0:
        raise InputError(f"--pilot-duration {pilot_s:g}: give a positive number of seconds")


def pilot_scenario(sc: Scenario, pilot_s: float) -> Scenario:
    """The scenario as a pilot: its own load and target, ``pilot_s`` measured seconds, no until: decided."""
    if sc.load.arrival in ("stages", "trace"):
        raise ScenarioError(f"a pilot of arrival {sc.load.arrival} would not be its plan cut short: run the "
                            "scenario once and give its directory with --from")
    data = sc.model_dump(mode="json", by_alias=False, exclude_none=True)
    data["load"].update(duration_s=pilot_s, until="duration")
    data["load"].pop("requests", None)
    data["load"].pop("max_duration_s", None)
    try:
        return Scenario.model_validate(data)
    except ValueError as exc:
        raise ScenarioError(f"the pilot: {exc}") from None


def size_from_run(run_dir: Path, opts: SizeOptions, scenario: Scenario | None = None) -> SizeResult:
    """Size every objective of the run in ``run_dir`` (its summary.json, else its records summarised); with
    ``scenario``, that scenario's objectives judged on the run's records."""
    info, own = read_run_info(run_dir)
    requests, chunks = scan_whole_records(run_dir)
    run = RunAnalysis(requests, chunks, (scenario or own).load.steady_state)  # the summary's own window
    stored = stored_summary(run_dir) if scenario is None else None
    summary: dict[str, Any] = stored[0] if stored is not None else \
        summarize(scenario or own, requests, chunks, info.get("planned"), run=run, ledger=False)[0]
    if not summary["requests"].get("completed"):
        raise RunDirError(f"{run_dir}: no measured request completed: nothing to size from")
    return size_run(str(run_dir), summary, run, opts)


def size(scenario: Scenario | None, from_run: Path | None, opts: SizeOptions, pilot_s: float,
         run_pilot: Callable[[Scenario], Path]) -> SizeResult:
    """From ``from_run`` (judged by ``scenario``'s objectives when given), or from a pilot of ``scenario`` that
    ``run_pilot`` runs (returning its directory)."""
    check_options(opts, pilot_s)
    if from_run is not None:
        return size_from_run(from_run, opts, scenario)
    if scenario is None:
        raise InputError("give a scenario, or a run directory with --from")
    return size_from_run(run_pilot(pilot_scenario(scenario, pilot_s)), opts)


def write_json(result: SizeResult) -> str:
    return json.dumps(result.as_dict(), indent=2)
