"""The newcomer's path, as the issue's Done-when states it (issue 40): the built wheel installed into a fresh
virtual environment that cannot see the clone; from an empty folder, ``loadgen run --base-url … --rate 4
--input-len 512 --output-len 128 --duration 20`` against a standalone simulator (its URL given without /v1, the
``vllm bench`` habit) passes with the start banner, the ETA and the figures; then ``loadgen scenario copy
long_context`` and the copy run: the README's main job from the wheel, its PNG charts drawn.

The environment: ``pip wheel`` of the clone, ``python -m venv --without-pip`` and ``pip --python`` installing the
wheel alone; the dependencies come from this interpreter's site-packages through a plain path line (``deps.pth``):
the ``.pth`` files in that folder (the clone's editable install) are not processed, so ``loadgen`` is the wheel's.

PASS also needs the generator to keep up (p99 queue delay within 10 ms, else INCONCLUSIVE, exit 3): like the
timing tests it wants a quiet machine; on a contended one (others' tests beside it under ``nice``) rerun it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from loadgen import __version__  # the clone's, which the wheel is built from
from tests.run_helpers import ROOT, read_until

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Newcomer:
    bin: Path  # the fresh environment's bin/
    home: Path  # an empty working folder, outside the clone
    env: dict[str, str]


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Newcomer:
    tmp = tmp_path_factory.mktemp("newcomer")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "wheel"), str(ROOT)],
                   check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp / "wheel").glob("loadgen-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=120)
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOADGEN_BASE_URL", "VIRTUAL_ENV")}
    env.update(COLUMNS="100", PYTHONDONTWRITEBYTECODE="1")
    return Newcomer(venv / "bin", home, env)


def run_cli(*args: str, at: Newcomer, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The fresh environment's ``loadgen ARGS`` from the empty folder."""
    return subprocess.run([str(at.bin / "loadgen"), *args], cwd=at.home, env=at.env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def simulator(newcomer: Newcomer) -> Iterator[str]:
    """A standalone simulator from the wheel (``loadgen-sim --port 0``): its root URL, without /v1."""
    proc = subprocess.Popen([str(newcomer.bin / "loadgen-sim"), "--port", "0"], cwd=newcomer.home, env=newcomer.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = read_until(proc, "listening on", 30)
        url = line.split("listening on ", 1)[1].split()[0]
        yield url.removesuffix("/v1")
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_wheel_is_what_runs_and_it_ships_the_scenarios(newcomer: Newcomer) -> None:
    code = ("import loadgen, importlib.resources as r; print(loadgen.__file__); "
            "print(sorted(p.name for p in r.files('loadgen.scenarios').iterdir()))")
    res = subprocess.run([str(newcomer.bin / "python"), "-c", code], cwd=newcomer.home, env=newcomer.env,
                         capture_output=True, text=True, check=True)
    where, names = res.stdout.splitlines()
    assert Path(where).is_relative_to(newcomer.bin.parent) and not Path(where).is_relative_to(ROOT), where
    for name in ("long_context.yaml", "smoke.yaml", "scenario.schema.json", "data"):
        assert repr(name) in names


def test_the_quick_start_passes_with_banner_eta_and_figures(newcomer: Newcomer, simulator: str) -> None:
    res = run_cli("run", "--base-url", simulator, "--rate", "4", "--input-len", "512", "--output-len", "128",
                  "--duration", "20", at=newcomer)
    assert res.returncode == 0, res.stdout + res.stderr
    out, err = res.stdout, res.stderr
    assert "verdict: PASS" in out
    assert "SLO: no failed request" in out  # the default objective, said
    assert "answered HTTP 404" not in out  # /v1 is optional (README): taken silently
    assert "tokens/s in" in out and "total" in out  # input, output and total token throughput
    assert f"loadgen {__version__} → {simulator}/v1" in err and "poisson 4 req/s" in " ".join(err.split())  # the banner
    assert "ETA " in err  # progress lines where stderr is not a terminal
    (run_dir,) = (newcomer.home / "reports").iterdir()  # the default place, under the folder it ran from
    assert (run_dir / "report.html").is_file()
    run_json = json.loads((run_dir / "run.json").read_text())
    assert not any("404" in note for note in run_json["notes"])  # /v1 added silently: the banner shows the URL


def test_a_copied_bundled_scenario_runs_from_the_wheel(newcomer: Newcomer) -> None:
    """The README's main job, copied out of the wheel and run (shortened; with its PNG charts): the copy's
    data and schema come along, and nothing of the clone is needed."""
    copy = run_cli("scenario", "copy", "long_context", at=newcomer)
    assert copy.returncode == 0, copy.stderr
    assert (newcomer.home / "long_context.yaml").is_file() and (newcomer.home / "scenario.schema.json").is_file()
    out = newcomer.home / "main-job"
    res = run_cli("run", "long_context.yaml", "--duration", "4", "--set", "load.warmup_s=1", "--no-progress",
                  "--out", str(out), at=newcomer)
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr
    assert "verdict:" in res.stdout
    assert {"requests.parquet", "summary.json", "report.html", "charts"} <= {p.name for p in out.iterdir()}
    assert any((out / "charts").glob("*.png"))


def test_the_wheel_serves_target_sim_with_its_readme_and_writes_the_nightly_workflow(newcomer: Newcomer) -> None:
    """Issue 50 (first use 7, the CI page): `loadgen target sim` from the wheel points to the simulator's README,
    which the wheel holds, and `loadgen scenario workflow` writes the workflow the clone runs, byte for byte."""
    proc = subprocess.Popen([str(newcomer.bin / "loadgen"), "target", "sim", "--port", "0"], cwd=newcomer.home,
                            env=newcomer.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = read_until(proc, "its fields and faults:", 30)
    finally:
        proc.terminate()
        proc.wait(10)
    readme = Path(lines.split("its fields and faults: ", 1)[1].split()[0])
    assert readme.is_relative_to(newcomer.bin.parent) and "loadgen-sim" in readme.read_text(), readme
    res = run_cli("scenario", "workflow", "ci", at=newcomer)
    assert res.returncode == 0, res.stderr
    workflow = ROOT / ".github" / "workflows" / "nightly-slo.yml"
    assert (newcomer.home / "ci" / "nightly-slo.yml").read_bytes() == workflow.read_bytes()
