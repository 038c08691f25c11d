"""What CI reads: junit.xml against the JUnit XSD, the nightly workflow against GitHub's schema (and its steps
run for real against the simulator), and `loadgen history`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xmlschema
import yaml

from loadgen.analysis.result import RunResult
from loadgen.report.writers import junit_xml
from tests.run_helpers import ROOT, run_cli, summary

WORKFLOW = ROOT / ".github" / "workflows" / "nightly-slo.yml"
XSD = xmlschema.XMLSchema(ROOT / "tests" / "data" / "junit-10.xsd")


def _objective(name: str, passed: bool | None) -> dict:
    return {"objective": name, "threshold": 100.0, "value": 120.5, "samples": 42, "passed": passed,
            "comparison": "<=", "note": "only 42 samples; p99.9 needs 1000"}


def test_junit_validates_against_the_junit_schema_with_failures_and_skips(tmp_path):
    s = {"verdict": "fail", "reasons": ["itl_ms.p99 = 120.5 (limit <= 100)"], "window_s": 61.25,
         "requests": {"completed": 10, "failed": 1}, "target": {"model": "m<&>", "base_url": "embedded"},
         "started_at": "2026-11-22T05:29:11+0000", "seed": 3, "loadgen_version": "0.1.0",
         "slo": [_objective("ttft_ms.p50", True), _objective("itl_ms.p99", False), _objective("itl_ms.p999", None)]}
    xml = junit_xml(RunResult.from_dict({"metrics": {}, "stalls": {}, **s}), "nightly")
    XSD.validate(xml.decode())
    doc = XSD.to_dict(xml.decode())
    suite = doc["testsuite"][0]
    assert (suite["@tests"], suite["@failures"], suite["@skipped"]) == ("3", "1", "1")
    failed = next(c for c in suite["testcase"] if c["@name"] == "itl_ms.p99")
    assert failed["failure"][0]["@message"] == "itl_ms.p99 = 120.5, threshold <= 100, 42 samples"


@pytest.mark.slow
def test_junit_of_a_real_run_validates(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--duration", "3", "--no-progress", "--no-png")
    assert res.returncode in (0, 1, 3), res.stderr
    XSD.validate(str(out / "junit.xml"))
    assert len(summary(out)["slo"]) == str((out / "junit.xml").read_text()).count("<testcase ")


def _check_workflow(path: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("check-jsonschema")
    return subprocess.run([str(exe), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_workflow_validates_and_a_broken_copy_does_not(tmp_path):
    ok = _check_workflow(WORKFLOW)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    text = WORKFLOW.read_text()
    for broken in (text.replace("runs-on:", "runs_on:"), text.replace("    steps:", "    stepz:"),
                   text.replace('cron: "30 2 * * *"', "cron: [30, 2]")):
        assert broken != text
        copy = tmp_path / "broken.yml"
        copy.write_text(broken)
        bad = _check_workflow(copy)
        assert bad.returncode == 1 and "Schema validation errors" in bad.stdout, bad.stdout


def _steps() -> dict[str, dict]:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return {s.get("id") or s.get("name") or s.get("uses"): s for s in jobs["slo"]["steps"]}


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, "PATH": path})


def _outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.mark.slow
def test_workflow_steps_run_the_nightly_against_the_simulator(tmp_path):
    """The run, compare, publish and verdict steps' shell, as GitHub runs it (secrets unset: empty strings)."""
    steps = _steps()
    assert steps["run"]["run"].count("scenarios/nightly.yaml") == 1 and (ROOT / "scenarios/nightly.yaml").exists()
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios")
    env = {"LOADGEN_BASE_URL": "", "LOADGEN_MODEL": "", "LOADGEN_API_KEY": "", "DURATION_S": "3",
           "GITHUB_OUTPUT": str(tmp_path / "run.out"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    run = _bash(steps["run"]["run"], tmp_path, env)
    assert run.returncode == 0, run.stderr
    run_code = _outputs(tmp_path / "run.out")["code"]
    assert run_code in ("0", "1", "3") and (tmp_path / "run" / "report.html").exists()
    shutil.copytree(tmp_path / "run", tmp_path / "baseline")  # last night's artifact, here the same run
    cmp = _bash(steps["compare"]["run"], tmp_path, {**env, "GITHUB_OUTPUT": str(tmp_path / "compare.out")})
    assert cmp.returncode == 0 and _outputs(tmp_path / "compare.out")["code"] == "0", cmp.stdout + cmp.stderr
    assert _bash(steps["Publish the summary"]["run"], tmp_path, env).returncode == 0
    published = (tmp_path / "summary.md").read_text()
    assert "## loadgen: nightly" in published and "## loadgen compare" in published
    verdict = _bash(steps["Verdict"]["run"], tmp_path, {"RUN_CODE": run_code, "COMPARE_CODE": "0"})
    assert verdict.returncode == int(run_code)
    assert _bash(steps["Verdict"]["run"], tmp_path, {"RUN_CODE": "0", "COMPARE_CODE": "1"}).returncode == 1


def test_history_without_runs_is_a_clear_exit_2(tmp_path):
    res = run_cli("history", str(tmp_path / "nope"))
    assert res.returncode == 2 and "not a directory" in res.stderr
    res = run_cli("history", str(tmp_path))
    assert res.returncode == 2 and "no run directories" in res.stderr


@pytest.mark.slow
def test_history_draws_every_run_and_links_its_report(tmp_path):
    for i in range(2):
        res = run_cli("run", "scenarios/smoke.yaml", "--out", str(tmp_path / f"r{i}"), "--duration", "2",
                      "--no-progress", "--no-png", "--set", "load.warmup_s=0")
        assert res.returncode in (0, 1, 3), res.stderr
    res = run_cli("history", str(tmp_path))
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "history.html").read_text()
    assert 'data-chart="trends"' in page and 'href="r0/report.html"' in page and 'href="r1/report.html"' in page
    assert "2 runs" in res.stdout
