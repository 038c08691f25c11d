"""The report pipeline: a run directory's records and run.json → the summary, the verdict and every report file
(``loadgen run`` at its end, ``loadgen report DIR`` at any time after, ``advise`` and sweeps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import yaml
from pydantic import ValidationError

from loadgen.analysis.advice_result import Advice
from loadgen.analysis.result import RunResult
from loadgen.analysis.run_analysis import RunAnalysis
from loadgen.analysis.summary import summarize
from loadgen.core.secrets import clip, write_text
from loadgen.plan.scenario import Scenario
from loadgen.report.build import write_report_page, write_reports
from loadgen.report.llmd_export import benchmark_report
from loadgen.report.shrink_report import ShrinkEntry
from loadgen.report.wording import with_headline
from loadgen.records.client_metrics import read_client_metrics
from loadgen.records.scan import as_os_error, load_records, load_server_metrics, merged_pair_damaged, scan_records
from loadgen.errors import RunDirError as RunDirError


INFO_TYPES: dict[str, type] = {"target": dict, "generator": dict, "notes": list, "findings": list, "planned": int,
                               "seed": int, "interrupted": bool, "finished": bool}  # what the summary reads
KIND_NAMES = {dict: "an object", list: "a list", int: "a whole number", bool: "true or false"}


def read_run_info(run_dir: Path) -> tuple[dict[str, Any], Scenario]:
    """run.json and its scenario; RunDirError naming the file and what is wrong with it."""
    path = run_dir / "run.json"
    if not path.exists():
        raise RunDirError(f"{run_dir}: no run.json (is this a loadgen run directory?)")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(info, dict) or not isinstance(info.get("scenario"), dict):
        raise RunDirError(f"{path}: no scenario in it (not a loadgen run.json?)")
    for key, kind in INFO_TYPES.items():
        if info.get(key) is not None and not isinstance(info[key], kind):
            raise RunDirError(f"{path}: its {key} is not {KIND_NAMES[kind]} ({clip(json.dumps(info[key]), 40)})")
    try:
        return info, Scenario.model_validate(info["scenario"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RunDirError(f"{path}: its scenario is not valid: {where}: {first['msg']}") from None


def read_whole_records(run_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every record of a run; RunDirError when a record file is damaged (a comparison or advice on part of
    the records would be wrong without saying so)."""
    broken: list[str] = []
    try:
        requests, chunks = load_records(run_dir, broken, merge=False)
    except FileNotFoundError as exc:
        raise RunDirError(str(exc)) from None
    if broken:
        raise RunDirError(damaged(run_dir, broken))
    return requests, chunks


def scan_whole_records(run_dir: Path) -> tuple[pl.DataFrame, pl.LazyFrame]:
    """``read_whole_records`` with the chunks as a lazy scan of their files (read later, in slices)."""
    if not (run_dir / "requests.parquet").exists() and not any(run_dir.glob("requests.part-*.parquet")):
        raise RunDirError(f"{run_dir}: no requests.parquet (is this a loadgen run directory?)")
    broken: list[str] = []
    requests, chunks = scan_records(run_dir, broken, merge=False)
    if broken:
        raise RunDirError(damaged(run_dir, broken))
    return requests, chunks


def damaged(run_dir: Path, broken: list[str]) -> str:
    """The one line naming the damaged record files (``load_records``'s ``broken``) and what is wrong."""
    return f"{run_dir}: damaged record files: {'; '.join(b.removesuffix(', skipped') for b in broken)}"


def rebuild_reports(run_dir: Path, scenario: Scenario | None = None, window: tuple[float, float] | None = None,
                    png: bool = True, again: bool = False) -> RunResult:
    """Compute the summary and every view from the Parquet records and run.json (``loadgen run`` at its end,
    ``loadgen report DIR`` at any time after: ``again``). Damaged record parts are skipped, named, and make it
    inconclusive. ``again``: a damaged requests.parquet or chunks.parquet is RunDirError and nothing is
    rewritten: those are written whole at a run's end, so the damage came after it (a copy cut short, a disk),
    and a summary of what is left would replace the run's own verdict with one of nothing."""
    info, stored = read_run_info(run_dir)
    scenario = scenario or stored
    broken: list[str] = []
    if not (run_dir / "requests.parquet").exists() and not any(run_dir.glob("requests.part-*.parquet")):
        raise FileNotFoundError(f"{run_dir}: no requests.parquet (is this a loadgen run directory?)")
    requests, chunks = scan_records(run_dir, broken)  # the chunks as a lazy scan: read in slices, once
    if again and merged_pair_damaged(broken):
        raise RunDirError(damaged(run_dir, broken))
    if broken:
        info["disk_error"] = "damaged record files skipped: " + "; ".join(broken)
    return report_records(run_dir, info, scenario, requests, chunks, window, png)


def report_records(run_dir: Path, info: dict[str, Any], scenario: Scenario, requests: pl.DataFrame,
                   chunks: pl.DataFrame | pl.LazyFrame, window: tuple[float, float] | None, png: bool) -> RunResult:
    """The summary of these records and run.json's ``info``; the report files written as far as the disk
    allows (a full disk is a note, the summary is still returned)."""
    extra = {"interrupted": info.get("interrupted", False), "notes": list(info.get("notes", [])),
             "model": info.get("target", {}).get("model"), "generator": info.get("generator", {}),
             "target": info.get("target", {}), "started_at": info.get("started_at"), "seed": info.get("seed"),
             "loadgen_version": info.get("loadgen_version"), "finished": info.get("finished", True),
             "disk_error": info.get("disk_error"), "stopped_early": info.get("stopped_early"),
             "sessions_not_finished": info.get("sessions_not_finished", [])}
    server = load_server_metrics(run_dir)
    run = RunAnalysis(requests, chunks, scenario.load.steady_state)  # one analysis: the summary and the views read it
    summary, tables = summarize(scenario, requests, chunks, info.get("planned"), extra, server, run,
                                client=read_client_metrics(run_dir))
    result = RunResult.from_dict(with_headline(summary), run_dir)
    try:
        write_reports(run_dir, result, scenario.name, tables, requests, chunks, window, png, server,
                      load_advice(run_dir), run, shrinks=load_shrinks(run_dir))
        write_benchmark_report(run_dir, result, info)
    except (OSError, pl.exceptions.PolarsError) as exc:
        result.notes.append(f"the report files could not all be written: {as_os_error(exc).strerror or exc}")
    return result


def write_benchmark_report(run_dir: Path, result: RunResult, info: dict[str, Any]) -> None:
    """benchmark_report.yaml beside summary.json: the run as llm-d's Benchmark Report v0.2
    (report/llmd_export.py), from the scenario as run.json keeps it (secrets masked)."""
    try:
        doc = benchmark_report(json.loads(json.dumps(result.to_dict(), default=str)), info["scenario"], run_dir.name)
    except (KeyError, TypeError, ValueError) as exc:  # a run.json scenario of a shape this loadgen lacks
        result.notes.append(f"benchmark_report.yaml not written: its scenario lacks {exc}")
        return
    write_text(run_dir / "benchmark_report.yaml", yaml.safe_dump(doc, sort_keys=False))  # redacted, whole or not at all


def stored_misses(run_dir: Path) -> pl.DataFrame | None:
    """misses.parquet as the run (or its last ``loadgen report``) wrote it; None where there is none."""
    try:
        return pl.read_parquet(run_dir / "misses.parquet")
    except (OSError, pl.exceptions.PolarsError):
        return None


def load_advice(run_dir: Path) -> Advice | None:
    """advice.json (``loadgen advise`` wrote it), for report.html's advice section; unreadable: none."""
    path = run_dir / "advice.json"
    if not path.exists():
        return None
    try:
        return Advice.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stored_summary(run_dir: Path) -> tuple[dict[str, Any], pl.DataFrame] | None:
    """summary.json and stalls.parquet as the run (or its last ``loadgen report``) wrote them, or None when
    either is missing or unreadable: what ``compare``, ``advise`` and a sweep's judging read instead of
    analysing the records again (one value per statistic: the summary's)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        stalls = pl.read_parquet(run_dir / "stalls.parquet")
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return None
    if not isinstance(summary, dict) or not {"metrics", "stalls", "slo", "verdict"} <= set(summary):
        return None
    return summary, stalls


def add_advice_section(run_dir: Path, png: bool) -> None:
    """report.html again, with advice.json's section, from the summary on disk (the whole report is rebuilt
    only where none is stored)."""
    stored = stored_summary(run_dir)
    if stored is None:
        rebuild_reports(run_dir, png=png)
        return
    summary, stalls = stored
    _, scenario = read_run_info(run_dir)
    requests, chunks = scan_records(run_dir, [], merge=False)
    try:
        write_report_page(run_dir, RunResult.from_dict(summary, run_dir), scenario.name, stalls, requests, chunks,
                          png, load_server_metrics(run_dir), load_advice(run_dir), stored_misses(run_dir),
                          shrinks=load_shrinks(run_dir))
    except ValueError:  # not a summary this loadgen reads back
        rebuild_reports(run_dir, png=png)



def load_shrinks(run_dir: Path) -> list[ShrinkEntry]:
    """Every ``loadgen shrink`` of the run in its default place (RUN/shrink-*/shrink.json, in name order), with
    its figure's spec where readable, for report.html's "Smallest reproduction" section; an unreadable or
    foreign shrink.json is left out."""
    out = []
    for path in sorted(run_dir.glob("shrink-*/shrink.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("event"), dict):
            continue
        spec: dict[str, Any] | None = None
        try:
            loaded = json.loads((path.parent / "figure.vl.json").read_text(encoding="utf-8"))
            spec = loaded if isinstance(loaded, dict) else None
        except (OSError, ValueError):
            pass
        out.append(ShrinkEntry(path.parent.name, doc, spec, (path.parent / "figure.png").exists()))
    return out


def add_shrink_section(run_dir: Path, png: bool) -> None:
    """report.html again, with the "Smallest reproduction" section (every RUN/shrink-*/) and advice.json's, from
    the summary on disk (as ``add_advice_section``; where none is stored, or one this loadgen cannot read back,
    the whole report is rebuilt first, then the page with the section)."""
    stored = stored_summary(run_dir)
    try:
        result = None if stored is None else RunResult.from_dict(stored[0], run_dir)
    except ValueError:  # not a summary this loadgen reads back
        result = None
    if stored is None or result is None:
        rebuild_reports(run_dir, png=png)
        stored = stored_summary(run_dir)
        if stored is None:  # the disk refused the summary: the rebuilt page stands
            return
        result = RunResult.from_dict(stored[0], run_dir)
    _, scenario = read_run_info(run_dir)
    requests, chunks = scan_records(run_dir, [], merge=False)
    write_report_page(run_dir, result, scenario.name, stored[1], requests, chunks, png, load_server_metrics(run_dir),
                      load_advice(run_dir), stored_misses(run_dir), load_shrinks(run_dir))
