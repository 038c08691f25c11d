"""loadgen.api: the docs' example (docs/python.md) as written, and what a caller relies on: a typed result that is
summary.json, the same verdict as the CLI, errors before anything is sent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen import api
from loadgen.analysis.result import SCHEMA_VERSION, RunResult
from tests.run_helpers import ROOT


def readme_example() -> str:
    """The example of the docs' Python page (docs/python.md), as written."""
    text = (ROOT / "docs" / "python.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    out = tmp_path / "api-smoke"
    code = readme_example().replace('"reports/api-smoke"', repr(str(out)))
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr  # from a folder with no scenarios/: it runs from anywhere
    verdict, exit_code = res.stdout.splitlines()[0].split()
    summary = json.loads((out / "summary.json").read_text())
    assert verdict == summary["verdict"] and int(exit_code) == {"pass": 0, "fail": 1, "inconclusive": 3}[verdict]
    assert res.stdout.splitlines()[-1] == "False"


def test_without_its_dependencies_the_import_says_what_to_install() -> None:
    """A clone's root on the path and nothing installed (-S: no site-packages): not a bare import error."""
    res = subprocess.run([sys.executable, "-S", "-c", "from loadgen import api"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "install loadgen into it first" in res.stderr.splitlines()[-1], res.stderr


@pytest.mark.slow
def test_run_returns_the_typed_result_that_summary_json_serialises(tmp_path: Path) -> None:
    sc = api.load_scenario(ROOT / "scenarios/smoke.yaml", {"load.duration_s": 3, "load.warmup_s": 0})
    result = api.run(sc, out=tmp_path / "run")
    assert result.run_dir == tmp_path / "run" and {"summary.json", "report.html", "requests.parquet"} <= \
        set(result.paths)
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(result.to_dict(), default=str))
    assert on_disk["schema_version"] == SCHEMA_VERSION
    assert RunResult.from_dict(on_disk, result.run_dir) == result
    assert result.requests["completed"] > 0 and result.metrics["ttft_ms"]["count"] == result.requests["completed"]
    assert result.slo_result("itl_ms.p99") is not None
    # the CLI's report of the same records gives the same verdict and exit code
    res = subprocess.run([sys.executable, "-m", "loadgen", "report", str(result.run_dir), "--no-png"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == result.exit_code


def test_bad_input_raises_one_clear_error_before_anything_is_sent(tmp_path: Path) -> None:
    with pytest.raises(api.ScenarioError, match="load.rate_per_s"):
        api.load_scenario(ROOT / "scenarios/smoke.yaml", ["load.rate_per_s=-1"])
    sc = api.load_scenario(ROOT / "scenarios/smoke.yaml", {"target.api_key_env": "LOADGEN_TEST_UNSET_KEY"})
    with pytest.raises(api.TargetError, match="LOADGEN_TEST_UNSET_KEY"):
        api.run(sc, out=tmp_path / "never")
    assert not (tmp_path / "never").exists() or not any((tmp_path / "never").glob("*.parquet"))
    with pytest.raises(api.ScenarioError, match="no run.json"):
        api.report(tmp_path)
    built = sc.with_source(None)  # a scenario built in code cannot be handed to Locust workers
    with pytest.raises(api.ScenarioError, match="workers need a scenario loaded from a file"):
        api.run(built, engine="locust", workers=2, out=tmp_path / "w")


@pytest.mark.slow
def test_run_works_from_an_async_caller_and_from_a_thread(tmp_path: Path) -> None:
    """A notebook runs an event loop in the main thread, and a service may call from a worker thread: the run
    gets a loop of its own either way."""
    import asyncio
    import threading

    sc = api.load_scenario(ROOT / "scenarios/smoke.yaml", {"load.duration_s": 2, "load.warmup_s": 0})

    async def from_a_loop() -> api.RunResult:
        return api.run(sc, out=tmp_path / "in-loop")

    in_loop = asyncio.run(from_a_loop())
    results: list[api.RunResult] = []
    worker = threading.Thread(target=lambda: results.append(api.run(sc, out=tmp_path / "in-thread")))
    worker.start()
    worker.join(120)
    for result in (in_loop, *results):
        assert result.requests["completed"] > 0 and (result.run_dir / "summary.json").exists()  # type: ignore
    assert len(results) == 1


def test_a_python_callers_console_gets_the_redactors_guarantee(tmp_path: Path) -> None:
    """What loadgen prints to a caller's console passes the redactor, as the CLI's stdout does (here a run
    directory named with a header's secret value, which the run prints); the caller's console is untouched."""
    import io

    from rich.console import Console

    secret = "hdr-api-secret-5b4a3c2d1e"
    sc = api.load_scenario(ROOT / "scenarios/smoke.yaml", {"load.duration_s": 2, "load.warmup_s": 0,
                                                            "target.headers": {"X-Api-Key": secret}})
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, record=True)
    result = api.run(sc, out=tmp_path / f"run-{secret}", console=console)
    printed = buffer.getvalue()
    assert result.run_dir.name == f"run-{secret}" and "run-***" in printed and secret not in printed
    assert console.file is buffer and console.width == 200 and console.record  # the caller's console, as it was
    assert secret not in console.export_text()  # rich records before the file: nothing of the run was recorded
