"""``loadgen run --repeat N``: the scenario N times with fresh seeds — the scenario's ``seed``, ``seed + 1``, …,
``seed + N − 1`` — each a full run in its own directory ``PARENT/run-01-seed<S>/`` …, then the runs combined
(analysis/repeat_result.py: across-run mean, t-interval and CV per metric, one verdict) into PARENT's
repeat.json, summary.md, junit.xml and repeat.html."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path
from typing import Callable

from rich.console import Console

from loadgen.analysis.repeat_result import RepeatResult, combine
from loadgen.analysis.result import RunResult
from loadgen.errors import ScenarioError
from loadgen.plan.scenario import Scenario

RunOne = Callable[[Scenario, Path], RunResult]
MAX_REPEAT = 100


def repeat_dir(sc: Scenario, out: Path | None, reports_dir: Path) -> Path:
    """``out``, or ``reports_dir/<time>-<name>-repeat``."""
    if out is not None:
        return out
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return reports_dir / f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', sc.name)}-repeat"


def check_repeat(n: int) -> None:
    if not 2 <= n <= MAX_REPEAT:
        raise ScenarioError(f"--repeat {n}: give 2 to {MAX_REPEAT} runs (an across-run interval needs two)")


def seeded(sc: Scenario, seed: int) -> Scenario:
    """The scenario with its seed replaced; its source's ``--set`` items say so too (Locust workers load the
    scenario again from its file and items, and must draw the same plan)."""
    one = sc.model_copy(update={"seed": seed})
    if sc.source is not None:
        path, items = sc.source
        one = one.with_source(path, [*items, f"seed={seed}"])
    return one


def run_name(index: int, seed: int) -> str:
    return f"run-{index + 1:02d}-seed{seed}"


def run_repeat(sc: Scenario, n: int, out: Path, run_one: RunOne, console: Console,
               confidence: float = 0.95) -> RepeatResult:
    """N runs (seeds ``sc.seed`` … ``sc.seed + n − 1``), combined and written to ``out``."""
    check_repeat(n)
    console.print(f"repeat {sc.name!r}: {n} runs, seeds {sc.seed}…{sc.seed + n - 1} → {out}", highlight=False)
    t0 = time.monotonic()
    runs, summaries = [], []
    for i in range(n):
        seed = sc.seed + i
        name = run_name(i, seed)
        result = run_one(seeded(sc, seed), out / name)
        runs.append({"dir": name, "seed": seed, "verdict": result.verdict, "exit_code": result.exit_code})
        summaries.append(result.to_dict())
        console.print(f"  run {i + 1}/{n} (seed {seed}): {result.verdict.upper()}", highlight=False)
        if result.interrupted:
            break  # Ctrl-C or SIGTERM: the runs done so far are combined, the verdict inconclusive
    result = combine(sc.name, runs, summaries, confidence, time.monotonic() - t0)
    if len(runs) < n:
        result.verdict = "inconclusive"
        result.reasons.insert(0, f"interrupted: {len(runs)} of {n} runs done")
    result.out_dir = out
    write_repeat(result, out)
    from loadgen.report.repeat_report import print_repeat

    print_repeat(console, result)
    return result


def write_repeat(result: RepeatResult, out: Path) -> None:
    """repeat.json, summary.md, junit.xml and repeat.html in the repeat's directory (redacted)."""
    from loadgen.core.secrets import write_bytes, write_text
    from loadgen.report import repeat_report as rep

    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "repeat.json", json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    write_text(out / "summary.md", rep.summary_markdown(result))
    write_bytes(out / "junit.xml", rep.junit_xml(result))
    write_text(out / "repeat.html", rep.render_html(result))
