"""Issue 50, first use 7 and the CI page: the simulator server is found where a newcomer looks (``loadgen target
sim``, named in ``loadgen --help``), starts, serves a quick start and stops on SIGTERM; bad options are one line
and exit 2 before anything starts. The nightly workflow ships in the package (the same bytes as
.github/workflows/nightly-slo.yml), ``loadgen scenario workflow`` writes it out, and its install and run steps
work outside loadgen's own repository. The "Gate CI on it" page is in the site's nav."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from loadgen.cli.app import app
from loadgen.plan import bundled
from local_target.server_process import port_free
from local_target.sim.config import PRESETS
from tests.run_helpers import ROOT, read_until, run_cli, start_cli, summary

WORKFLOW = ROOT / ".github" / "workflows" / "nightly-slo.yml"
PAGE = ROOT / "docs" / "guides" / "ci-gating.md"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_target_sim_serves_a_quick_start_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    proc = start_cli("target", "sim", "--port", str(port), "--preset", "t4-phi3-mini", "--model", "sim-t4",
                     "--", "--time-scale", "0.2")
    try:
        ready = read_until(proc, "its fields and faults:", 60)  # its three start lines
        base = f"http://127.0.0.1:{port}"
        assert f"simulator ready: {base}/v1" in ready and "preset t4-phi3-mini" in ready
        assert f"loadgen run --base-url {base}/v1" in ready  # the next command, runnable as printed
        readme = Path(ready.split("its fields and faults: ", 1)[1].split()[0])
        assert readme.name == "README.md" and "loadgen-sim" in readme.read_text()
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200
        out = tmp_path / "run"
        res = run_cli("run", "--base-url", base, "--rate", "8", "--input-len", "64", "--output-len", "8",
                      "--duration", "1", "--set", "load.warmup_s=0", "--out", str(out), "--no-progress", "--no-png")
        assert res.returncode in (0, 3), res.stdout + res.stderr  # 3: only if this machine lagged the schedule
        s = summary(out)
        assert s["target"]["model"] == "sim-t4" and s["requests"]["completed"] > 0 and not s["requests"]["failed"]
    finally:
        proc.send_signal(signal.SIGTERM)  # by its PID, as `kill PID`
        code = proc.wait(30)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert port_free("127.0.0.1", port)  # the simulator went with it


def test_target_sim_refuses_bad_options_before_starting() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = CliRunner().invoke(app, ["target", "sim", "--port", str(port)])
        assert res.exit_code == 2 and f"127.0.0.1:{port} is busy" in res.stderr and "--port 0" in res.stderr
    cases = [(["--set", "bogus=1"], "bogus: Extra inputs are not permitted"),
             (["--set", "max_num_seqs=-3"], "max_num_seqs"),
             (["--", "--no-such-field", "1"], "no_such_field: Extra inputs"),
             (["--config", "/nonexistent/engine.yaml"], "/nonexistent/engine.yaml")]
    for args, named in cases:
        res = CliRunner().invoke(app, ["target", "sim", "--port", "0", *args])
        assert res.exit_code == 2 and named in res.stderr, (args, res.output)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["target", "sim", "--preset", "b200"])
    assert res.exit_code == 2 and "t4-phi3-mini" in res.output


def test_the_simulator_is_found_from_help_and_its_presets_are_the_simulators() -> None:
    from loadgen.cli.target import SimPreset

    assert sorted(p.value for p in SimPreset) == sorted(PRESETS)
    root = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    assert "sim (also loadgen-sim)" in " ".join(root.split())
    target = CliRunner().invoke(app, ["target", "--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    assert "sim " in target and "loadgen-sim" in target


def test_the_workflow_ships_in_the_package_and_is_written_out_never_over_a_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = bundled.folder() / "ci" / "nightly-slo.yml"
    assert shipped.read_bytes() == WORKFLOW.read_bytes(), "copy .github/workflows/nightly-slo.yml over it"
    monkeypatch.chdir(tmp_path)  # the repository's root: the default folder is .github/workflows under it
    first = CliRunner().invoke(app, ["scenario", "workflow"])
    written = tmp_path / ".github" / "workflows" / "nightly-slo.yml"
    assert first.exit_code == 0 and written.read_bytes() == WORKFLOW.read_bytes(), first.output
    assert "written" in first.output and "loadgen scenario copy nightly scenarios" in first.output
    again = CliRunner().invoke(app, ["scenario", "workflow"])
    assert again.exit_code == 0 and "already there" in again.output
    written.write_text("# mine\n")
    res = CliRunner().invoke(app, ["scenario", "workflow"])
    assert res.exit_code == 2 and "exists and differs" in res.stderr and written.read_text() == "# mine\n"
    other = CliRunner().invoke(app, ["scenario", "workflow", str(tmp_path / "ci")])
    assert other.exit_code == 0 and (tmp_path / "ci" / "nightly-slo.yml").read_bytes() == WORKFLOW.read_bytes()


def _steps() -> dict[str, dict]:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return {s.get("id") or s.get("name") or s.get("uses"): s for s in jobs["slo"]["steps"]}


def _stubbed(script: str, cwd: Path, env: dict[str, str]) -> str:
    """The step's shell with ``pip`` and ``loadgen`` stubs on PATH that print what they were given."""
    stubs = cwd / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("pip", "loadgen"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*"\n')
        (stubs / name).chmod(stat.S_IRWXU)
    res = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", **env})
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_workflow_installs_and_runs_outside_loadgens_repository(tmp_path: Path) -> None:
    steps = _steps()
    install, run = steps["Install loadgen"]["run"], steps["run"]["run"]
    assert _stubbed(install, tmp_path, {"LOADGEN_PIP": ""}) == "pip install .\n"  # loadgen's own checkout
    spec = "loadgen @ https://example.invalid/loadgen-0.1.0-py3-none-any.whl"
    assert _stubbed(install, tmp_path, {"LOADGEN_PIP": spec}) == f"pip install {spec}\n"
    env = {"GITHUB_OUTPUT": str(tmp_path / "out"), "LOADGEN_API_KEY": "", "DURATION_S": ""}
    assert _stubbed(run, tmp_path, env).startswith("loadgen run nightly --out run")  # the bundled one
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "nightly.yaml").write_text("name: mine\n")
    assert _stubbed(run, tmp_path, env).startswith("loadgen run scenarios/nightly.yaml --out run")
    assert "nightly" in bundled.names()


def test_the_ci_gating_page_is_in_the_nav_and_says_what_a_gate_reads() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "guides/ci-gating.md" in nav
    text = PAGE.read_text()
    for code in ("| `0` |", "| `1` |", "| `2` |", "| `3` |", "| `4` |"):
        assert code in text
    for needed in ("loadgen scenario workflow", "junit.xml", "loadgen history", "INCONCLUSIVE",
                   "load.until=decided", "--until decided", "--require", "loadgen sweep"):
        assert needed in text, needed
    assert "guides/ci-gating.md" in (ROOT / "README.md").read_text()
